package dockerbuild

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse_ReadsStagesContinuationLinesAndTheExecForm(t *testing.T) {
	const dockerfile = `# syntax=docker/dockerfile:1
ARG GO=1.26

# Build.
FROM golang:${GO} AS Build
WORKDIR /src
RUN --mount=type=cache,target=/go/pkg/mod \
    # a comment inside the instruction is dropped
    go build \

      -o /out/relay ./cmd/relay
FROM scratch
copy --from=build /out/relay /relay
ENTRYPOINT ["/relay"]
CMD serve --addr :8080
`
	d, err := Parse("Dockerfile", strings.NewReader(dockerfile))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := &Dockerfile{
		Name: "Dockerfile",
		Args: []Instruction{{Line: 2, Keyword: "ARG", Args: "GO=1.26"}},
		Stages: []*Stage{
			{
				Index: 0, Name: "build",
				From: Instruction{Line: 5, Keyword: "FROM", Args: "golang:${GO} AS Build"},
				Instructions: []Instruction{
					{Line: 6, Keyword: "WORKDIR", Args: "/src"},
					{Line: 7, Keyword: "RUN", Flags: []string{"--mount=type=cache,target=/go/pkg/mod"},
						Args: "go build       -o /out/relay ./cmd/relay"},
				},
			},
			{
				Index: 1,
				From:  Instruction{Line: 12, Keyword: "FROM", Args: "scratch"},
				Instructions: []Instruction{
					{Line: 13, Keyword: "COPY", Flags: []string{"--from=build"}, Args: "/out/relay /relay"},
					{Line: 14, Keyword: "ENTRYPOINT", Args: `["/relay"]`, Exec: []string{"/relay"}},
					{Line: 15, Keyword: "CMD", Args: "serve --addr :8080"},
				},
			},
		},
	}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
	if st, ok := d.Stage("BUILD"); !ok || st.Index != 0 {
		t.Errorf(`Stage("BUILD") = %v, %v; want stage 0: stage names ignore case`, st, ok)
	}
	if st, ok := d.Stage("1"); !ok || st != d.Final() {
		t.Errorf(`Stage("1") = %v, %v; want the final stage`, st, ok)
	}
	if got, want := d.Stages[0].Instructions[1].String(), "RUN --mount=type=cache,target=/go/pkg/mod go build -o /out/relay ./cmd/relay"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestParse_RefusesWhatItDoesNotReadAsDockerDoes(t *testing.T) {
	tests := []struct {
		name, dockerfile, want string
	}{
		{"another escape character", "# escape=`\nFROM scratch\n", "Dockerfile:1: escape directive"},
		{"a here-document", "FROM golang:1.26\nRUN <<EOF\ngo build\nEOF\n", "Dockerfile:2: RUN <<EOF: here-documents are not supported"},
		{"no FROM", "# nothing\n", "no FROM instruction"},
		{"an instruction before FROM", "WORKDIR /src\nFROM scratch\n", "Dockerfile:1: WORKDIR before the first FROM"},
		{"a dangling continuation", "FROM scratch\nCMD a \\\n", "Dockerfile:2: the last instruction ends with a line continuation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("Dockerfile", strings.NewReader(tt.dockerfile))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse: error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
