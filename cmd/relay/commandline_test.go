package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/relayq/relay/internal/cli"
)

// The command lines that the image and docker-compose.yml give relay are
// parsed with relay's own flag sets, and the variables the Compose file
// sets are checked against those relay reads.

func TestDockerfile_CommandIsARelayCommandLine(t *testing.T) {
	d := parseDockerfile(t)
	entry := imageEntrypoint(t, d)
	cmd, ok := d.Final().Last("CMD")
	if !ok {
		t.Fatalf("%s: the image has no CMD: relay without a command only prints its usage", d.Name)
	}
	if cmd.Exec == nil {
		t.Fatalf("%s:%d: %s: want the exec form, [\"serve\", ...]: the image has no shell", d.Name, cmd.Line, cmd)
	}
	if err := checkRelayCommandLine(append(slices.Clone(entry.Exec[1:]), cmd.Exec...)); err != nil {
		t.Errorf("%s:%d: %s: %v", d.Name, cmd.Line, cmd, err)
	}
}

func TestDockerCompose_RelayServicesRunRelayCommandLines(t *testing.T) {
	d := parseDockerfile(t)
	entry := imageEntrypoint(t, d)
	cmd, _ := d.Final().Last("CMD")
	compose := readCompose(t)
	reads := relayEnvironment(t)

	services := compose.relayServices()
	if len(services) == 0 {
		t.Fatalf("%s: no service is built from the Dockerfile (build: .) or runs the image such a service builds", composeFile)
	}
	for _, name := range services {
		svc := compose.Services[name]
		t.Run(name, func(t *testing.T) {
			if df := svc.Build.Dockerfile; df != "" && path.Clean(df) != d.Name {
				t.Errorf("%s: service %s builds %s; this check reads %s", composeFile, name, df, d.Name)
			}
			args, where := cmd.Exec, fmt.Sprintf("%s:%d: CMD", d.Name, cmd.Line)
			switch {
			case svc.Command.Set:
				args = svc.Command.Args
				where = fmt.Sprintf("%s:%d: service %s: command", composeFile, svc.Command.Line, name)
			case svc.Entrypoint.Set:
				// An entrypoint of its own drops the image's CMD.
				args = nil
				where = fmt.Sprintf("%s:%d: service %s: entrypoint", composeFile, svc.Entrypoint.Line, name)
			}
			if svc.Entrypoint.Set {
				if len(svc.Entrypoint.Args) == 0 || svc.Entrypoint.Args[0] != entry.Exec[0] {
					t.Errorf("%s:%d: service %s: entrypoint %q is not relay, which the image has at %s",
						composeFile, svc.Entrypoint.Line, name, svc.Entrypoint.Args, entry.Exec[0])
				}
				args = append(slices.Clone(svc.Entrypoint.Args[min(1, len(svc.Entrypoint.Args)):]), args...)
			} else {
				args = append(slices.Clone(entry.Exec[1:]), args...)
			}
			if err := checkRelayCommandLine(args); err != nil {
				t.Errorf("%s %q: %v", where, args, err)
			}
			for _, v := range svc.Environment.Names {
				if !reads[v.Name] && !readByRelaysLibraries(v.Name) {
					t.Errorf("%s:%d: service %s sets %s, which relay does not read (it reads %s)",
						composeFile, v.Line, name, v.Name, strings.Join(sortedKeys(reads), ", "))
				}
			}
		})
	}
}

func TestDockerCommandLineCheck_RefusesWhatRelayWouldRefuse(t *testing.T) {
	tests := []struct {
		args []string
		want string // in the error, or "" for none
	}{
		{[]string{"serve", "--addr", "0.0.0.0:8080", "--slots", "2"}, ""},
		{[]string{"migrate", "up", "--log-format", "json"}, ""},
		{[]string{"work", "--shutdown-grace=20s"}, ""},
		{nil, "no relay command"},
		{[]string{"server"}, `unknown command "server"`},
		{[]string{"serve", "--adr", "0.0.0.0:8080"}, "flag provided but not defined: -adr"},
		{[]string{"work", "--slots", "many"}, `invalid value "many" for flag -slots`},
		{[]string{"serve", "--addr"}, "flag needs an argument: -addr"},
		{[]string{"work", "-h"}, "asks for the help"},
		{[]string{"experiment", "crash"}, "relaylab"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			err := checkRelayCommandLine(tt.args)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("checkRelayCommandLine(%q): %v", tt.args, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("checkRelayCommandLine(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
		})
	}
}

// checkRelayCommandLine checks the arguments relay is given, after its
// name, with the flag set of the command they name, as relay parses them:
// the command must exist, and its flags be defined and well formed. The
// positional arguments are left to the command.
func checkRelayCommandLine(args []string) error {
	if len(args) == 0 {
		return errors.New("no relay command: relay only prints its usage")
	}
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
		if c.name != args[0] {
			continue
		}
		if c.flags == nil {
			return fmt.Errorf("relay %s passes its arguments to another program (relaylab), which the image does not have", c.name)
		}
		_, err := c.flags().Parse(args[1:], io.Discard)
		if errors.Is(err, cli.ErrHelp) {
			return errors.New("asks for the help (-h), and would run nothing")
		}
		return err
	}
	return fmt.Errorf("unknown command %q: relay's commands are %s", args[0], strings.Join(names, ", "))
}

// relayEnvironment returns the environment variables relay reads: the
// names, given as string literals, of the calls to getenv, os.Getenv and
// os.LookupEnv in the Go files of this module that relay is built from.
func relayEnvironment(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps",
		"-f", `{{if and .Module .Module.Main}}{{range .GoFiles}}{{$.Dir}}{{"/"}}{{.}}{{"\n"}}{{end}}{{end}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	reads := make(map[string]bool)
	fset := token.NewFileSet()
	for _, file := range strings.Fields(string(out)) {
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 || !isEnvRead(call.Fun) {
				return true
			}
			var name string
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				name, _ = strconv.Unquote(lit.Value)
			}
			if name == "" {
				t.Errorf("%s: reads an environment variable not named by a string literal, which this check cannot see", fset.Position(call.Pos()))
				return true
			}
			reads[name] = true
			return true
		})
	}
	if len(reads) == 0 {
		t.Fatal("found no environment variable that relay reads")
	}
	return reads
}

// isEnvRead reports whether fun is getenv (the function relay's commands
// are given), os.Getenv or os.LookupEnv.
func isEnvRead(fun ast.Expr) bool {
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name == "getenv"
	case *ast.SelectorExpr:
		pkg, ok := f.X.(*ast.Ident)
		return ok && pkg.Name == "os" && (f.Sel.Name == "Getenv" || f.Sel.Name == "LookupEnv")
	}
	return false
}

// readByRelaysLibraries reports whether a variable is one that relay reads
// through its libraries rather than its own code: libpq's PG* variables,
// which pgx reads for what the database URL leaves out, and the Go
// runtime's (GOMAXPROCS, GODEBUG, ...) and TZ.
func readByRelaysLibraries(name string) bool {
	return strings.HasPrefix(name, "PG") || strings.HasPrefix(name, "GO") || name == "TZ"
}

// composeFile is the Compose file of the repository.
const composeFile = "docker-compose.yml"

// compose is what this check reads of a Compose file.
type compose struct {
	Services map[string]composeService `yaml:"services"`
}

// composeService is what this check reads of a service.
type composeService struct {
	Image       string         `yaml:"image"`
	Build       composeBuild   `yaml:"build"`
	Entrypoint  composeCommand `yaml:"entrypoint"`
	Command     composeCommand `yaml:"command"`
	Environment composeEnv     `yaml:"environment"`
}

// composeBuild is a service's build: a context directory, or a mapping
// with one.
type composeBuild struct {
	Context    string
	Dockerfile string
}

func (b *composeBuild) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	var m struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	b.Context, b.Dockerfile = m.Context, m.Dockerfile
	return nil
}

// composeCommand is a command or an entrypoint: a list of arguments, or a
// string that Compose splits at spaces.
type composeCommand struct {
	Set  bool
	Args []string
	Line int
}

func (c *composeCommand) UnmarshalYAML(n *yaml.Node) error {
	c.Set, c.Line = true, n.Line
	if n.Kind == yaml.ScalarNode {
		if strings.ContainsAny(n.Value, `"'\`) {
			return fmt.Errorf("line %d: a command with quotes: write it as a list, which this check reads", n.Line)
		}
		c.Args = strings.Fields(n.Value)
		return nil
	}
	return n.Decode(&c.Args)
}

// composeEnv is a service's environment: the names it sets, from a mapping
// or a list of NAME=value.
type composeEnv struct {
	Names []composeVar
}

// composeVar is a variable a service sets.
type composeVar struct {
	Name string
	Line int
}

func (e *composeEnv) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			e.Names = append(e.Names, composeVar{n.Content[i].Value, n.Content[i].Line})
		}
	case yaml.SequenceNode:
		for _, item := range n.Content {
			name, _, _ := strings.Cut(item.Value, "=")
			e.Names = append(e.Names, composeVar{name, item.Line})
		}
	default:
		return fmt.Errorf("line %d: environment: want a mapping or a list", n.Line)
	}
	return nil
}

// readCompose reads the repository's Compose file.
func readCompose(t *testing.T) *compose {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, composeFile))
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	return &c
}

// relayServices returns, sorted, the services that run relay's image:
// those built from the repository (build: .) and those that run the image
// one of them builds.
func (c *compose) relayServices() []string {
	built := make(map[string]bool)
	for _, svc := range c.Services {
		if svc.Build.Context != "" && path.Clean(svc.Build.Context) == "." && svc.Image != "" {
			built[svc.Image] = true
		}
	}
	var names []string
	for _, name := range sortedKeys(c.Services) {
		svc := c.Services[name]
		if (svc.Build.Context != "" && path.Clean(svc.Build.Context) == ".") || built[svc.Image] {
			names = append(names, name)
		}
	}
	return names
}
