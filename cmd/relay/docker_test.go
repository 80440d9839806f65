package main

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	goversion "go/version"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/internal/dockerbuild"
)

// The Docker image, proven without Docker: the stages of the Dockerfile
// that the image copies from run on this machine, in a copy of the build
// context as Docker would send it (see package dockerbuild).

// repoRoot is the root of the repository: the build context of the
// Dockerfile and of docker-compose.yml.
const repoRoot = "../.."

// dockerBuildTimeout bounds the build of the image's files, which compiles
// relay from a cold cache the first time.
const dockerBuildTimeout = 10 * time.Minute

func TestDockerfile_BuildsRelayFromWhatTheBuildContextHolds(t *testing.T) {
	ctx := testContext(t, dockerBuildTimeout)
	d := parseDockerfile(t)
	work := t.TempDir()
	contextDir := filepath.Join(work, "context")
	if err := dockerbuild.CopyContext(contextDir, repoRoot, filepath.Join(repoRoot, d.Name)); err != nil {
		t.Fatal(err)
	}
	b := &dockerbuild.Build{
		Dockerfile: d,
		Context:    contextDir,
		Source:     repoRoot,
		Dir:        filepath.Join(work, "stages"),
		Env:        golangImageEnv(t),
	}
	if err := b.Run(ctx); err != nil {
		t.Fatalf("the image does not build from its build context (the repository, less what .dockerignore excludes):\n%v", err)
	}

	final := d.Final()
	entry := imageEntrypoint(t, d)
	bin := filepath.Join(b.Root(final), filepath.FromSlash(entry.Exec[0]))
	if info, err := os.Stat(bin); err != nil || info.Mode().Perm()&0o111 == 0 {
		t.Fatalf("%s:%d: %s: the image has no executable %s: %v", d.Name, entry.Line, entry, entry.Exec[0], err)
	}
	if image := d.BaseImage(final); hasNoCLibrary(image) {
		if interp := elfInterpreter(t, bin); interp != "" {
			t.Errorf("%s:%d: FROM %s has no C library, but %s is linked dynamically (with %s): build it with CGO_ENABLED=0",
				d.Name, final.From.Line, image, entry.Exec[0], interp)
		}
	}
	out, err := exec.CommandContext(ctx, bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "relay ") {
		t.Errorf("%s version: %v, output %q; want the version of relay", entry.Exec[0], err, out)
	}
}

func TestDockerfile_GoImageIsNewEnoughForGoMod(t *testing.T) {
	d := parseDockerfile(t)
	goMod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go\s+(\S+)\s*$`).FindSubmatch(goMod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	required := "go" + string(m[1])
	checked := 0
	for _, st := range d.Stages {
		image := d.BaseImage(st)
		repo, tag, _ := strings.Cut(strings.SplitN(image, "@", 2)[0], ":")
		if path.Base(repo) != "golang" {
			continue
		}
		release, _, _ := strings.Cut(tag, "-") // 1.26-bookworm, 1.26.8-alpine
		if !regexp.MustCompile(`^\d+\.\d+(\.\d+)?$`).MatchString(release) {
			t.Logf("%s:%d: FROM %s: no Go version in the tag to check", d.Name, st.From.Line, image)
			continue
		}
		checked++
		// golang:1.26 is the newest 1.26.x: only its language version is known.
		have, want := "go"+release, required
		if strings.Count(release, ".") == 1 {
			want = goversion.Lang(required)
		}
		if goversion.Compare(have, want) < 0 {
			t.Errorf("%s:%d: FROM %s: its Go %s is older than go.mod's go %s, and the golang image sets GOTOOLCHAIN=local, so the build fails",
				d.Name, st.From.Line, image, release, m[1])
		}
	}
	if checked == 0 {
		t.Logf("%s: no stage FROM a golang image with a versioned tag", d.Name)
	}
}

// parseDockerfile parses the repository's Dockerfile.
func parseDockerfile(t *testing.T) *dockerbuild.Dockerfile {
	t.Helper()
	d, err := dockerbuild.ParseFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// imageEntrypoint returns the image's ENTRYPOINT, which must name a
// program in the exec form: the image has no shell.
func imageEntrypoint(t *testing.T, d *dockerbuild.Dockerfile) dockerbuild.Instruction {
	t.Helper()
	entry, ok := d.Final().Last("ENTRYPOINT")
	if !ok {
		t.Fatalf("%s: the image has no ENTRYPOINT", d.Name)
	}
	if len(entry.Exec) == 0 {
		t.Fatalf("%s:%d: %s: want the exec form, [\"/path/to/relay\"]: the image has no shell", d.Name, entry.Line, entry)
	}
	return entry
}

// hasNoCLibrary reports whether a base image is one without a C library,
// where only a statically linked program runs.
func hasNoCLibrary(image string) bool {
	return image == "scratch" || strings.Contains(image, "distroless/static") || strings.Contains(image, "chainguard/static")
}

// elfInterpreter returns the dynamic linker the program at path asks for,
// or "" for a statically linked one.
func elfInterpreter(t *testing.T, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				t.Fatalf("read the interpreter of %s: %v", path, err)
			}
			return string(bytes.TrimRight(b, "\x00"))
		}
	}
	return ""
}

// golangImageEnv is the environment the build stage's RUN gets in place of
// the golang image's: the image's Go settings (no go env file, hence no
// GOFLAGS but the Dockerfile's, and GOTOOLCHAIN=local), with this
// machine's Go caches, which the Dockerfile's cache mounts stand for, and
// its way to the module proxy.
func golangImageEnv(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "-json", "GOCACHE", "GOMODCACHE", "GOPATH",
		"GOPROXY", "GONOPROXY", "GOSUMDB", "GONOSUMDB", "GOPRIVATE", "GOINSECURE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	var goEnv map[string]string
	if err := json.Unmarshal(out, &goEnv); err != nil {
		t.Fatalf("go env: %v", err)
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"TMPDIR=" + os.TempDir(),
		"GOENV=off",
		"GOTOOLCHAIN=local",
	}
	for _, k := range sortedKeys(goEnv) {
		if goEnv[k] != "" {
			env = append(env, k+"="+goEnv[k])
		}
	}
	return env
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
