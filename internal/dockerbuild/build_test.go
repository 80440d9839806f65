package dockerbuild

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// build parses dockerfile and builds it from a context of files, returning
// the build and its error.
func build(t *testing.T, dockerfile string, files map[string]string) (*Build, error) {
	t.Helper()
	source := writeTree(t, files)
	d, err := Parse("Dockerfile", strings.NewReader(dockerfile))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	work := t.TempDir()
	contextDir := filepath.Join(work, "context")
	if err := CopyContext(contextDir, source, filepath.Join(source, "Dockerfile")); err != nil {
		t.Fatalf("CopyContext: %v", err)
	}
	b := &Build{Dockerfile: d, Context: contextDir, Source: source, Dir: filepath.Join(work, "stages"), Env: os.Environ()}
	return b, b.Run(t.Context())
}

func TestBuild_RunsTheStagesTheImageCopiesFromInRootsOfTheirOwn(t *testing.T) {
	const dockerfile = `FROM golang:1.26 AS build
WORKDIR /src
COPY . .
ARG GREETING=hello
ENV WHO="the world"
RUN mkdir -p /out/share && cp data/in.txt /out/share/ && echo "$GREETING, $WHO" > /out/greeting

FROM golang:1.26 AS unused
RUN exit 1

FROM scratch
WORKDIR /app
COPY --from=build /out/greeting ./
COPY --from=build /out/share /usr/share/
COPY data/in.txt /etc/in.txt
USER nonroot
ENTRYPOINT ["/app/greeting"]
`
	b, err := build(t, dockerfile, map[string]string{"data/in.txt": "in", ".dockerignore": ".dockerignore\n"})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	final := b.Root(b.Dockerfile.Final())
	for name, want := range map[string]string{
		"app/greeting":     "hello, the world\n",
		"usr/share/in.txt": "in",
		"etc/in.txt":       "in",
	} {
		got, err := os.ReadFile(filepath.Join(final, name))
		if err != nil || string(got) != want {
			t.Errorf("/%s in the image = %q (%v), want %q", name, got, err, want)
		}
	}
	if b.Root(b.Dockerfile.Stages[1]) != "" {
		t.Error("the build ran a stage the image does not copy from")
	}
	if _, err := os.Stat(filepath.Join(b.Root(b.Dockerfile.Stages[0]), "out", "greeting")); err != nil {
		t.Errorf("RUN did not write /out under the stage's root: %v", err)
	}
}

func TestBuild_NamesTheStepThatFails(t *testing.T) {
	tests := []struct {
		name       string
		dockerfile string
		want       []string
	}{
		{
			"a file the ignore file excludes",
			"FROM golang:1.26 AS build\nWORKDIR /src\nCOPY go.mod go.sum ./\n",
			[]string{"Dockerfile:3: [stage build] COPY go.mod go.sum ./: source go.sum: not in the build context: the ignore file (.dockerignore) excludes it"},
		},
		{
			"a file nowhere",
			"FROM golang:1.26\nCOPY go.work .\n",
			[]string{"Dockerfile:2: [stage 0] COPY go.work .: source go.work: no such file in the build context"},
		},
		{
			"a failing RUN, with its output",
			"FROM golang:1.26 AS build\nCOPY . .\nRUN cat missing.go\n",
			[]string{"Dockerfile:3: [stage build] RUN cat missing.go: exit status 1; its output:", "missing.go: No such file"},
		},
		{
			"what another stage does not make",
			"FROM golang:1.26 AS build\nRUN true\nFROM scratch\nCOPY --from=build /out/relay /relay\n",
			[]string{"Dockerfile:4: [stage 1] COPY --from=build /out/relay /relay: source /out/relay: no such file in that stage"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.dockerfile, map[string]string{"go.mod": "module x", "go.sum": "", ".dockerignore": "go.sum\n"})
			if err == nil {
				t.Fatal("Run succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run: %v\nwant an error containing %q", err, w)
				}
			}
		})
	}
}

func TestBuild_RefusesWhatItCannotDoAsDockerWould(t *testing.T) {
	tests := []struct {
		name, dockerfile, want string
	}{
		{"RUN on another base image", "FROM alpine:3\nRUN true\n", "RUN runs only in a stage FROM a golang image"},
		{"a mount other than a cache", "FROM golang:1.26\nRUN --mount=type=secret,id=token true\n", "only --mount=type=cache is"},
		{"RUN as another user", "FROM golang:1.26\nUSER nobody\nRUN true\n", "RUN as USER nobody is not supported"},
		{"ADD", "FROM golang:1.26\nADD go.mod .\n", "ADD is not supported"},
		{"SHELL", "FROM golang:1.26\nSHELL [\"/bin/bash\", \"-c\"]\n", "SHELL is not supported"},
		{"COPY from an image", "FROM scratch\nCOPY --from=golang:1.26 /usr/local/go /go\n", "copying from an image is not supported"},
		{"COPY --parents", "FROM scratch\nCOPY --parents go.mod /\n", "COPY --parents is not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.dockerfile, map[string]string{"go.mod": "module x"})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run: error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
