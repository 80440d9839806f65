// Package cli holds what Relay's commands (relay, and the lab's relaylab)
// share of their command lines: flag sets that mix flags and arguments and
// report a mistake in one line, the usage error that exits with status 2,
// the logging, database and worker flags, and the garbage collector's
// target they run at.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/relayq/relay/worker"
)

// UsageError is a mistake in the command line. A program exits with status
// 2 for it, 1 for any other error (see ExitCode).
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

// Usagef returns a UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{msg: fmt.Sprintf(format, args...)}
}

// ErrHelp reports that a command printed its help: the program exits 0.
var ErrHelp = errors.New("help requested")

// Helped turns ErrHelp into success.
func Helped(err error) error {
	if errors.Is(err, ErrHelp) {
		return nil
	}
	return err
}

// ExitCode is the status a program exits with after err: 0 for none, 2 for
// a UsageError, 1 for anything else.
func ExitCode(err error) int {
	var u *UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		return 2
	default:
		return 1
	}
}

// OneLine is err's message on one line, as a program prints it.
func OneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

// FlagSet is a command's flags with the text its -h prints above them.
type FlagSet struct {
	*flag.FlagSet
	usage   string
	command string
}

// NewFlagSet returns a flag set that reports nothing itself: Parse turns
// its errors into one line, and prints the usage only when asked to. The
// synopsis ("relay enqueue KIND [flags]") starts with the command's words.
func NewFlagSet(name, synopsis, description string) *FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &FlagSet{
		FlagSet: fs,
		usage:   "Usage: " + synopsis + "\n\n" + description + "\n",
		command: commandOf(synopsis),
	}
}

// commandOf returns the words of a synopsis that name the command: those
// before the first flag or argument ("--id", "KIND", "[flags]").
func commandOf(synopsis string) string {
	var words []string
	for _, w := range strings.Fields(synopsis) {
		if r := []rune(w)[0]; r == '[' || r == '-' || unicode.IsUpper(r) {
			break
		}
		words = append(words, w)
	}
	return strings.Join(words, " ")
}

// Parse parses args, which may mix flags and positional arguments in any
// order ("--" ends the flags), and returns the positional arguments. On -h
// it prints the usage to stderr and returns ErrHelp; a bad flag is a
// UsageError of one line.
func (fs *FlagSet) Parse(args []string, stderr io.Writer) ([]string, error) {
	var positional []string
	for {
		err := fs.FlagSet.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, fs.usage)
			fmt.Fprintln(stderr, "\nFlags:")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			fs.SetOutput(io.Discard)
			return nil, ErrHelp
		}
		if err != nil {
			return nil, Usagef("%s: %v (run \"%s -h\" for usage)", fs.Name(), fs.explain(err), fs.command)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if fs.endedAtDoubleDash(args[:len(args)-len(rest)]) {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// endedAtDoubleDash reports whether the flag package's Parse, having
// consumed these arguments, stopped at a "--" that ends the flags, not at
// one that is a flag's value ("--queue --"). It reads them as Parse did.
func (fs *FlagSet) endedAtDoubleDash(consumed []string) bool {
	for i := 0; i < len(consumed); i++ {
		arg := consumed[i]
		if arg == "--" {
			return true
		}
		name := strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
		if strings.Contains(name, "=") {
			continue
		}
		if f := fs.Lookup(name); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				continue
			}
		}
		i++ // the flag's value
	}
	return false
}

// explain returns err, an error of the flag package's Parse, with the
// reason a duration flag's value was refused where the flag package says
// only "parse error": a unit missing ("10") or unknown ("7d"), or a length
// no duration holds ("3000000h").
func (fs *FlagSet) explain(err error) error {
	msg, ok := strings.CutSuffix(err.Error(), ": parse error")
	if !ok {
		return err
	}
	// "invalid value %q for flag -%s": the value, quoted, may hold the
	// words between them; the flag's name cannot.
	i := strings.LastIndex(msg, " for flag -")
	if i < 0 {
		return err
	}
	quoted, ok := strings.CutPrefix(msg[:i], "invalid value ")
	name := msg[i+len(" for flag -"):]
	f := fs.Lookup(name)
	if !ok || f == nil {
		return err
	}
	getter, ok := f.Value.(flag.Getter)
	if !ok {
		return err
	}
	if _, ok := getter.Get().(time.Duration); !ok {
		return err
	}
	value, uerr := strconv.Unquote(quoted)
	if uerr != nil {
		return err
	}
	_, perr := time.ParseDuration(value)
	if perr == nil {
		return err
	}
	if durationSyntax.MatchString(value) {
		// Written as a duration is, so refused for its length alone.
		return fmt.Errorf("invalid value %q for flag -%s: longer than the longest duration, %s (about 292 years)",
			value, name, time.Duration(math.MaxInt64))
	}
	return fmt.Errorf("invalid value %q for flag -%s: %v: durations take units h, m, s, ms, us or ns, as in 168h (7 days) or 1m30s", value, name, perr)
}

// durationSyntax matches what time.ParseDuration reads, whatever its
// length: a sign, then numbers, each with a unit. A value it matches that
// ParseDuration refuses is longer than a time.Duration holds.
var durationSyntax = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// LogFlags are the logging flags every command has.
type LogFlags struct {
	Format string
	Level  string
}

// Register adds --log-format and --log-level to fs.
func (l *LogFlags) Register(fs *FlagSet) {
	fs.StringVar(&l.Format, "log-format", "text", "log format: text or json")
	fs.StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn or error")
}

// Logger returns a logger writing to w as the flags ask.
func (l *LogFlags) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		return nil, Usagef("invalid --log-level %q: want debug, info, warn or error", l.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.Format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, Usagef("invalid --log-format %q: want text or json", l.Format)
	}
}

// DBFlags is the --database-url flag, with DATABASE_URL as its fallback.
type DBFlags struct{ URL string }

// Register adds --database-url to fs.
func (d *DBFlags) Register(fs *FlagSet) {
	// The environment is read after parsing, so that -h never prints a
	// password from it as the default.
	fs.StringVar(&d.URL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
}

// Resolve returns the database URL from the flag or the environment.
func (d *DBFlags) Resolve(getenv func(string) string) (string, error) {
	if d.URL != "" {
		return d.URL, nil
	}
	if u := getenv("DATABASE_URL"); u != "" {
		return u, nil
	}
	return "", Usagef("no database: give --database-url or set DATABASE_URL (e.g. postgres://user:password@localhost:5432/relay)")
}

// WorkerFlags configure a worker.
type WorkerFlags struct {
	SessionURL      string
	Queue           string
	Slots           int
	ID              string
	Lease           time.Duration
	Heartbeat       time.Duration
	Poll            time.Duration
	ReclaimInterval time.Duration
	QueueListeners  int
	Prefetch        int
	PrefetchWait    time.Duration
	ShutdownGrace   time.Duration
	BackoffBase     time.Duration
	RetainSucceeded time.Duration
	RetainDead      time.Duration
	RetainCancelled time.Duration

	// fs is the flag set Register added the flags to, which tells
	// whether --prefetch was given.
	fs *FlagSet
	// names are the flags Register added.
	names map[string]bool
}

// Register adds the worker's flags to fs, --slots with the default and
// help given.
func (w *WorkerFlags) Register(fs *FlagSet, defaultSlots int, slotsHelp string) {
	w.fs = fs
	before := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { before[f.Name] = true })
	fs.StringVar(&w.SessionURL, "session-database-url", "", "PostgreSQL URL of the worker's session, which shows it alive: PostgreSQL itself or a session-mode pool, never a transaction-mode pooler (default $RELAY_SESSION_DATABASE_URL, else the database URL)")
	fs.StringVar(&w.Queue, "queue", worker.DefaultQueue, "queue to work on")
	fs.IntVar(&w.Slots, "slots", defaultSlots, slotsHelp)
	fs.StringVar(&w.ID, "id", "", "worker id, unique among live workers (default host-pid-random)")
	fs.DurationVar(&w.Lease, "lease", worker.DefaultLease, "how long a claim holds a job without a heartbeat")
	fs.DurationVar(&w.Heartbeat, "heartbeat", 0, "how often leases are renewed (default lease/3)")
	fs.DurationVar(&w.Poll, "poll", worker.DefaultPollInterval, "how often an idle worker looks for jobs no notification announced; a listening worker of a fleet of more than 16 on its queue less often, in proportion to the fleet")
	fs.DurationVar(&w.ReclaimInterval, "reclaim-interval", worker.DefaultReclaimInterval, "how often jobs of dead workers and expired leases are taken back")
	fs.IntVar(&w.QueueListeners, "queue-listeners", worker.DefaultQueueListeners, "how many workers of the queue, at most, listen for its new jobs (each is woken by every commit of the database that notifies); the others look every --poll and with every completion (-1: every worker listens)")
	fs.IntVar(&w.Prefetch, "prefetch", 0, fmt.Sprintf("jobs claimed ahead of a free slot while jobs are short (default: as many as --slots, at least %d; 0 or -1: none)", worker.DefaultMinPrefetch))
	fs.DurationVar(&w.PrefetchWait, "prefetch-wait", worker.DefaultPrefetchWait, "longest a job claimed ahead waits for a slot before it is released")
	fs.DurationVar(&w.ShutdownGrace, "shutdown-grace", worker.DefaultShutdownGrace, "how long running jobs may finish at shutdown before they are released (0: release at once)")
	fs.DurationVar(&w.RetainSucceeded, "retain-succeeded", worker.DefaultRetainSucceeded, "how long a succeeded job is kept after it finished, then deleted (0: forever)")
	fs.DurationVar(&w.RetainDead, "retain-dead", worker.DefaultRetainDead, "how long a dead job is kept after it finished, then deleted (0: forever)")
	fs.DurationVar(&w.RetainCancelled, "retain-cancelled", worker.DefaultRetainCancelled, "how long a cancelled job is kept after it finished, then deleted (0: forever)")
	fs.DurationVar(&w.BackoffBase, "backoff-base", worker.DefaultBackoffBase,
		fmt.Sprintf("retry backoff after the first failure, doubling each attempt up to %s (for tests and demos)", worker.DefaultBackoffMax))
	w.names = map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if !before[f.Name] {
			w.names[f.Name] = true
		}
	})
}

// ResolveEnv fills in what comes from the environment. It runs after the
// flags are parsed, so that -h never prints a password from it.
func (w *WorkerFlags) ResolveEnv(getenv func(string) string) {
	if w.SessionURL == "" {
		w.SessionURL = getenv("RELAY_SESSION_DATABASE_URL")
	}
}

// GivenBesidesSlots returns the worker's flags, other than --slots, given
// on the command line Register's flag set parsed, as "--name", in
// lexical order: they configure worker slots, and mean nothing to a
// command that runs none.
func (w *WorkerFlags) GivenBesidesSlots() []string {
	var given []string
	if w.fs != nil {
		w.fs.Visit(func(f *flag.Flag) {
			if w.names[f.Name] && f.Name != "slots" {
				given = append(given, "--"+f.Name)
			}
		})
	}
	return given
}

// given reports whether the flag named name was given on the command line
// Register's flag set parsed.
func (w *WorkerFlags) given(name string) bool {
	found := false
	if w.fs != nil {
		w.fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	}
	return found
}

// Config returns the worker configuration the flags describe, or a usage
// error for anything worker.New would refuse in it. A flag given zero
// means zero, never the package's default: --shutdown-grace 0 releases at
// once, --prefetch 0 claims no job ahead, and the others must be positive
// (--heartbeat 0 is its default, lease/3).
func (w *WorkerFlags) Config(logger *slog.Logger) (worker.Config, error) {
	if w.Queue == "" {
		return worker.Config{}, Usagef("--queue must not be empty")
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"--lease", w.Lease}, {"--poll", w.Poll}, {"--reclaim-interval", w.ReclaimInterval}, {"--prefetch-wait", w.PrefetchWait}} {
		if f.d <= 0 {
			return worker.Config{}, Usagef("%s must be positive, got %s", f.name, f.d)
		}
	}
	if w.Heartbeat < 0 {
		return worker.Config{}, Usagef("--heartbeat must be positive, or 0 for a third of --lease, got %s", w.Heartbeat)
	}
	grace := w.ShutdownGrace
	if grace == 0 {
		grace = -1 // worker.Config's zero is its default
	}
	if w.QueueListeners == 0 || w.QueueListeners < -1 {
		return worker.Config{}, Usagef("--queue-listeners must be positive, or -1 for every worker, got %d", w.QueueListeners)
	}
	prefetch := w.Prefetch
	switch {
	case prefetch < -1:
		return worker.Config{}, Usagef("--prefetch must be 0 or -1 (none) or positive, got %d", prefetch)
	case prefetch == 0 && w.given("prefetch"):
		prefetch = -1 // worker.Config's zero is its default
	}
	if w.BackoffBase <= 0 {
		return worker.Config{}, Usagef("--backoff-base must be positive, got %s", w.BackoffBase)
	}
	var retain [3]time.Duration
	for i, f := range []struct {
		name string
		d    time.Duration
	}{{"--retain-succeeded", w.RetainSucceeded}, {"--retain-dead", w.RetainDead}, {"--retain-cancelled", w.RetainCancelled}} {
		switch {
		case f.d < 0:
			return worker.Config{}, Usagef("%s must be 0 (keep forever) or positive, got %s", f.name, f.d)
		case f.d == 0:
			retain[i] = worker.KeepForever
		default:
			retain[i] = f.d
		}
	}
	cfg := worker.Config{
		SessionDatabaseURL: w.SessionURL,
		Queue:              w.Queue,
		Slots:              w.Slots,
		ID:                 w.ID,
		Lease:              w.Lease,
		HeartbeatInterval:  w.Heartbeat,
		PollInterval:       w.Poll,
		ReclaimInterval:    w.ReclaimInterval,
		QueueListeners:     w.QueueListeners,
		Prefetch:           prefetch,
		PrefetchWait:       w.PrefetchWait,
		ShutdownGrace:      grace,
		RetainSucceeded:    retain[0],
		RetainDead:         retain[1],
		RetainCancelled:    retain[2],
		Backoff:            worker.ExponentialBackoff(w.BackoffBase, worker.DefaultBackoffMax),
		Logger:             logger,
	}
	if err := cfg.Validate(); err != nil {
		return worker.Config{}, Usagef("%s", err)
	}
	return cfg, nil
}
