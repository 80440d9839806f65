package dockerbuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// maxOutputLines is how much of a failed RUN's output its error carries.
const maxOutputLines = 40

// Build builds the files of an image as its Dockerfile describes them,
// without Docker. Each stage's file system is a directory, its root, in
// which WORKDIR, COPY, ENV and ARG do what Docker does. RUN runs on this
// machine, with this machine's tools in place of the base image's, so it
// runs only in a stage FROM a golang image, whose tools are Go's; its
// command sees the stage's paths (its WORKDIRs, the destinations of its
// COPYs and the paths other stages COPY --from it) under the stage's root,
// and every other absolute path as this machine's. Cache mounts
// (RUN --mount=type=cache) are left to the environment: give it this
// machine's Go caches. Run fails on anything else it cannot do as Docker
// would, naming the instruction.
type Build struct {
	// Dockerfile is what to build.
	Dockerfile *Dockerfile
	// Context is the directory holding the build context, as CopyContext
	// makes it.
	Context string
	// Source, if set, is the directory the context was copied from: a
	// COPY source missing from the context but present there is reported
	// as excluded by the ignore file.
	Source string
	// Dir is an empty directory to hold the stages' roots.
	Dir string
	// Env is the environment RUN starts from, before the stage's ENV and
	// ARG: this machine's, standing in for the golang image's.
	Env []string

	roots map[int]string
}

// stage is the state of a stage being built.
type stage struct {
	*Stage
	root    string
	workdir string            // absolute, in the stage
	env     map[string]string // ENV values
	args    map[string]string // ARG values, which ENV values hide
	user    string
	golang  bool     // FROM a golang image: RUN may run
	owned   []string // absolute paths in the stage that RUN sees under root
}

// Run builds the final stage and every stage it copies from.
func (b *Build) Run(ctx context.Context) error {
	b.roots = make(map[int]string)
	needed, err := b.needed()
	if err != nil {
		return err
	}
	for _, st := range b.Dockerfile.Stages {
		if !needed[st.Index] {
			continue
		}
		if err := b.runStage(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// Root returns the directory that holds the file system of a stage Run
// built, or "" if it built no such stage.
func (b *Build) Root(st *Stage) string { return b.roots[st.Index] }

// needed returns the indexes of the final stage and of those it depends on,
// through FROM and COPY --from.
func (b *Build) needed() (map[int]bool, error) {
	needed := make(map[int]bool)
	var visit func(st *Stage) error
	visit = func(st *Stage) error {
		if needed[st.Index] {
			return nil
		}
		needed[st.Index] = true
		if from, ok := b.Dockerfile.Stage(b.expandFrom(st)); ok && from.Index < st.Index {
			if err := visit(from); err != nil {
				return err
			}
		}
		for _, in := range st.Instructions {
			ref, ok := in.Flag("from")
			if !ok || in.Keyword != "COPY" {
				continue
			}
			from, ok := b.Dockerfile.Stage(ref)
			if !ok || from.Index >= st.Index {
				return b.fail(st, in, fmt.Errorf("--from=%s: no earlier stage of that name (copying from an image is not supported)", ref))
			}
			if err := visit(from); err != nil {
				return err
			}
		}
		return nil
	}
	return needed, visit(b.Dockerfile.Final())
}

// expandFrom returns the image a stage's FROM names, its variables
// replaced.
func (b *Build) expandFrom(st *Stage) string { return b.Dockerfile.BaseImage(st) }

func (b *Build) fail(st *Stage, in Instruction, err error) error {
	name := st.Name
	if name == "" {
		name = fmt.Sprint(st.Index)
	}
	return fmt.Errorf("%s:%d: [stage %s] %s: %w", b.Dockerfile.Name, in.Line, name, in, err)
}

func (b *Build) runStage(ctx context.Context, st *Stage) error {
	s := &stage{
		Stage:   st,
		root:    filepath.Join(b.Dir, fmt.Sprintf("stage-%d", st.Index)),
		workdir: "/",
		env:     make(map[string]string),
		args:    make(map[string]string),
	}
	if _, ok := st.From.Flag("platform"); ok {
		return b.fail(st, st.From, errors.New("--platform is not supported"))
	}
	image := b.expandFrom(st)
	if from, ok := b.Dockerfile.Stage(image); ok && from.Index < st.Index {
		if err := copyTree(s.root, b.roots[from.Index]); err != nil {
			return b.fail(st, st.From, err)
		}
		s.golang = b.isGolang(from)
	} else {
		if err := os.MkdirAll(s.root, 0o755); err != nil {
			return b.fail(st, st.From, err)
		}
		s.golang = isGolangImage(image)
	}
	s.owned = b.ownedPaths(st)
	b.roots[st.Index] = s.root
	for _, in := range st.Instructions {
		if err := b.runInstruction(ctx, s, in); err != nil {
			return b.fail(st, in, err)
		}
	}
	return nil
}

// isGolang reports whether st, or the stage it starts from, starts from a
// golang image.
func (b *Build) isGolang(st *Stage) bool {
	image := b.expandFrom(st)
	if from, ok := b.Dockerfile.Stage(image); ok && from.Index < st.Index {
		return b.isGolang(from)
	}
	return isGolangImage(image)
}

// isGolangImage reports whether image is the official golang image, at
// any tag: golang:1.26, docker.io/library/golang:1.26-bookworm, ...
func isGolangImage(image string) bool {
	name, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	for _, prefix := range []string{"docker.io/library/", "index.docker.io/library/", "library/"} {
		name = strings.TrimPrefix(name, prefix)
	}
	return name == "golang"
}

// ownedPaths returns the absolute paths of the stage that RUN sees under
// the stage's root: its WORKDIRs, the directories its COPYs write to, and
// what other stages copy from it and the directories holding it, longest
// first.
func (b *Build) ownedPaths(st *Stage) []string {
	var owned []string
	add := func(p string) {
		if p = path.Clean(p); p != "/" && !slices.Contains(owned, p) {
			owned = append(owned, p)
		}
	}
	workdir := "/"
	for _, in := range st.Instructions {
		switch in.Keyword {
		case "WORKDIR":
			workdir = inStage(workdir, in.Args)
			add(workdir)
		case "COPY":
			if words := copyArgs(in); len(words) >= 2 {
				add(inStage(workdir, words[len(words)-1]))
			}
		}
	}
	for _, other := range b.Dockerfile.Stages {
		for _, in := range other.Instructions {
			ref, ok := in.Flag("from")
			if from, found := b.Dockerfile.Stage(ref); in.Keyword != "COPY" || !ok || !found || from.Index != st.Index {
				continue
			}
			if words := copyArgs(in); len(words) >= 2 {
				for _, src := range words[:len(words)-1] {
					add(inStage("/", src))
					add(path.Dir(inStage("/", src)))
				}
			}
		}
	}
	sort.Slice(owned, func(i, j int) bool { return len(owned[i]) > len(owned[j]) })
	return owned
}

// inStage resolves p, absolute or relative to workdir, to a clean
// absolute path in a stage.
func inStage(workdir, p string) string {
	if !path.IsAbs(p) {
		p = path.Join(workdir, p)
	}
	return path.Clean(p)
}

func (b *Build) runInstruction(ctx context.Context, s *stage, in Instruction) error {
	switch in.Keyword {
	case "WORKDIR":
		s.workdir = inStage(s.workdir, expand(in.Args, s.vars()))
		return os.MkdirAll(s.host(s.workdir), 0o755)
	case "ENV":
		words := splitWords(in.Args)
		if len(words) > 0 && !strings.Contains(words[0], "=") {
			// The old form: ENV NAME the rest is the value.
			name, value, _ := strings.Cut(strings.TrimSpace(in.Args), " ")
			s.env[name] = expand(strings.TrimSpace(value), s.vars())
			return nil
		}
		for _, w := range words {
			name, value, _ := strings.Cut(w, "=")
			s.env[name] = expand(value, s.vars())
		}
		return nil
	case "ARG":
		global := b.Dockerfile.globalArgs()
		for _, w := range splitWords(in.Args) {
			name, value, hasDefault := strings.Cut(w, "=")
			if !hasDefault {
				value = global[name]
			}
			s.args[name] = expand(value, s.vars())
		}
		return nil
	case "COPY":
		return b.copy(s, in)
	case "RUN":
		return b.run(ctx, s, in)
	case "USER":
		s.user = expand(in.Args, s.vars())
		return nil
	case "ENTRYPOINT", "CMD", "EXPOSE", "LABEL", "STOPSIGNAL", "HEALTHCHECK":
		return nil // the image's settings: no files change
	default:
		return fmt.Errorf("%s is not supported by this check", in.Keyword)
	}
}

// vars returns the variables that instructions other than RUN expand:
// ARG values, then ENV values over them.
func (s *stage) vars() map[string]string {
	vars := make(map[string]string, len(s.args)+len(s.env))
	for k, v := range s.args {
		vars[k] = v
	}
	for k, v := range s.env {
		vars[k] = v
	}
	return vars
}

// host returns where the stage's absolute path p is on this machine.
func (s *stage) host(p string) string {
	return filepath.Join(s.root, filepath.FromSlash(p))
}

// copyArgs returns the sources and destination of a COPY.
func copyArgs(in Instruction) []string {
	if in.Exec != nil {
		return in.Exec
	}
	return splitWords(in.Args)
}

func (b *Build) copy(s *stage, in Instruction) error {
	srcRoot, fromContext := b.Context, true
	for _, f := range in.Flags {
		name, value, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		switch name {
		case "from":
			from, _ := b.Dockerfile.Stage(value) // needed() checked it
			srcRoot, fromContext = b.roots[from.Index], false
		case "chown", "chmod", "link":
			// Owners, modes and layering: the same files either way.
		default:
			return fmt.Errorf("COPY %s is not supported by this check", f)
		}
	}
	words := slices.Clone(copyArgs(in))
	if len(words) < 2 {
		return errors.New("want at least one source and a destination")
	}
	vars := s.vars()
	for i := range words {
		words[i] = expand(words[i], vars)
	}
	srcs, dest := words[:len(words)-1], words[len(words)-1]
	destDir := strings.HasSuffix(dest, "/") || dest == "." || dest == ".."
	dest = inStage(s.workdir, dest)

	var files []string // relative to srcRoot
	for _, src := range srcs {
		rel := strings.TrimPrefix(path.Clean("/"+src), "/")
		if rel == "" {
			rel = "."
		}
		if strings.ContainsAny(rel, "*?[") {
			matches, err := filepath.Glob(filepath.Join(srcRoot, filepath.FromSlash(rel)))
			if err != nil {
				return fmt.Errorf("source %s: %w", src, err)
			}
			if len(matches) == 0 {
				return fmt.Errorf("source %s: %s", src, b.missing(rel, fromContext))
			}
			for _, m := range matches {
				r, _ := filepath.Rel(srcRoot, m)
				files = append(files, r)
			}
			destDir = destDir || len(srcs) > 1 || len(matches) > 1
			continue
		}
		if _, err := os.Stat(filepath.Join(srcRoot, filepath.FromSlash(rel))); err != nil {
			return fmt.Errorf("source %s: %s", src, b.missing(rel, fromContext))
		}
		files = append(files, filepath.FromSlash(rel))
	}
	if len(srcs) > 1 && !strings.HasSuffix(words[len(words)-1], "/") {
		return errors.New("with more than one source, the destination must be a directory, ending in /")
	}
	for _, rel := range files {
		src := filepath.Join(srcRoot, rel)
		info, err := os.Stat(src)
		if err != nil {
			return err
		}
		target := s.host(dest)
		switch {
		case info.IsDir():
			// The directory's contents go into the destination.
		case destDir || isDir(target):
			target = filepath.Join(target, filepath.Base(src))
		}
		if err := copyTree(target, src); err != nil {
			return err
		}
	}
	return nil
}

// missing says why the source rel is not where COPY looks for it.
func (b *Build) missing(rel string, fromContext bool) string {
	switch {
	case !fromContext:
		return "no such file in that stage"
	case b.Source != "" && pathExists(filepath.Join(b.Source, filepath.FromSlash(rel))):
		return "not in the build context: the ignore file (.dockerignore) excludes it"
	default:
		return "no such file in the build context"
	}
}

func (b *Build) run(ctx context.Context, s *stage, in Instruction) error {
	for _, f := range in.Flags {
		mount, ok := strings.CutPrefix(f, "--mount=")
		if !ok || !slices.Contains(strings.Split(mount, ","), "type=cache") {
			return fmt.Errorf("RUN %s is not supported by this check (only --mount=type=cache is)", f)
		}
	}
	if !s.golang {
		return fmt.Errorf("RUN runs only in a stage FROM a golang image, with this machine's Go in its place; this stage is FROM %s", b.expandFrom(s.Stage))
	}
	if s.user != "" {
		return fmt.Errorf("RUN as USER %s is not supported by this check", s.user)
	}
	argv := []string{"/bin/sh", "-c", s.rewrite(in.Args)}
	if in.Exec != nil {
		argv = make([]string, len(in.Exec))
		for i, a := range in.Exec {
			argv[i] = s.rewrite(a)
		}
	}
	if len(argv) == 0 {
		return errors.New("no command")
	}
	dir := s.host(s.workdir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = slices.Clone(b.Env)
	for _, vars := range []map[string]string{s.args, s.env} {
		for k, v := range vars {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Env = append(cmd.Env, "PWD="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w; its output:\n%s", err, lastLines(out.String(), maxOutputLines))
	}
	return nil
}

// rewrite returns a RUN command with each path the stage owns, where it
// starts a word, replaced by where it is on this machine.
func (s *stage) rewrite(cmd string) string {
	var b strings.Builder
	for i := 0; i < len(cmd); {
		if cmd[i] == '/' && (i == 0 || strings.IndexByte(" \t\n=:'\"(", cmd[i-1]) >= 0) {
			if p, ok := s.ownedAt(cmd[i:]); ok {
				b.WriteString(s.host(p))
				i += len(p)
				continue
			}
		}
		b.WriteByte(cmd[i])
		i++
	}
	return b.String()
}

// ownedAt returns the owned path that rest starts with, if any, followed by
// the end of a word or a slash.
func (s *stage) ownedAt(rest string) (string, bool) {
	for _, p := range s.owned { // longest first
		if tail, ok := strings.CutPrefix(rest, p); ok && (tail == "" || strings.IndexByte("/ \t\n'\";&|)", tail[0]) >= 0) {
			return p, true
		}
	}
	return "", false
}

// copyTree copies src, a file or a directory, to dst: a directory's
// contents are merged into dst.
func copyTree(dst, src string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel == "." && !d.IsDir() {
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			return copyEntry(dst, p, d)
		}
		return copyEntry(filepath.Join(dst, rel), p, d)
	})
}

// expand replaces $NAME, ${NAME}, ${NAME:-default} and ${NAME:+alternate}
// in s with the values of vars, as Dockerfile instructions other than RUN
// do; an unset variable is empty.
func expand(s string, vars map[string]string) string {
	return os.Expand(s, func(ref string) string {
		name, word, op := ref, "", ""
		if i := strings.Index(ref, ":"); i >= 0 && i+1 < len(ref) {
			name, op, word = ref[:i], ref[i:i+2], ref[i+2:]
		}
		v, set := vars[name]
		switch op {
		case ":-":
			if !set || v == "" {
				return expand(word, vars)
			}
		case ":+":
			if set && v != "" {
				return expand(word, vars)
			}
			return ""
		}
		return v
	})
}

// splitWords splits the arguments of COPY, ENV, ARG and the like into
// words at unquoted white space, removing quotes and backslash escapes.
func splitWords(s string) []string {
	var (
		words []string
		w     strings.Builder
		in    bool // inside a word
		quote byte
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '"' || c == '\''):
			quote, in = c, true
		case c == '\\' && quote != '\'' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			in = true
		case quote == 0 && isSpace(rune(c)):
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines before]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

func isDir(p string) bool {
	info, err := os.Stat(p)
	return err == nil && info.IsDir()
}

func pathExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
