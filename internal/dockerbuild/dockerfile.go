// Package dockerbuild builds an image's files as a Dockerfile describes
// them, on this machine and without Docker, so that tests can prove that
// the image builds from what its build context holds. CopyContext copies a
// directory as Docker sends it to the builder, honouring .dockerignore with
// Docker's own pattern matching; Parse reads a Dockerfile; a Build runs the
// stages the final one copies from, each in a directory that stands in for
// its file system.
package dockerbuild

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Dockerfile is a parsed Dockerfile.
type Dockerfile struct {
	// Name is how errors name the file, e.g. "Dockerfile".
	Name string
	// Args are the ARG instructions before the first FROM, whose values
	// only FROM lines see, and stages that declare them again.
	Args []Instruction
	// Stages are the FROM sections in order; the last one is the image.
	Stages []*Stage
}

// Stage is one FROM section of a Dockerfile.
type Stage struct {
	// Index is the stage's position, from 0, by which COPY --from may
	// name it too.
	Index int
	// Name is the name given with FROM ... AS name, or "".
	Name string
	// From is the FROM instruction.
	From Instruction
	// Instructions are those after FROM, in order.
	Instructions []Instruction
}

// Instruction is one instruction of a Dockerfile.
type Instruction struct {
	// Line is the line it starts on, from 1.
	Line int
	// Keyword is the instruction in upper case: RUN, COPY, ...
	Keyword string
	// Flags are the leading options of FROM, RUN, COPY, ADD and
	// HEALTHCHECK, such as "--from=build", as written.
	Flags []string
	// Args is the rest, with continuation lines joined.
	Args string
	// Exec holds the elements of Args when it is a JSON array of strings
	// (the exec form of RUN, CMD, ENTRYPOINT, COPY, ...), else nil.
	Exec []string
}

// String is the instruction on one line, as Docker's build output shows
// it, shortened when long.
func (in Instruction) String() string {
	s := strings.Join(strings.Fields(strings.Join(append(append([]string{in.Keyword}, in.Flags...), in.Args), " ")), " ")
	const maxLen = 160
	if len(s) > maxLen {
		s = s[:maxLen-3] + "..."
	}
	return s
}

// flagKeywords are the instructions whose leading --options Parse takes
// apart from their arguments.
var flagKeywords = map[string]bool{"FROM": true, "RUN": true, "COPY": true, "ADD": true, "HEALTHCHECK": true}

// execKeywords are the instructions that have an exec (JSON) form.
var execKeywords = map[string]bool{"RUN": true, "CMD": true, "ENTRYPOINT": true, "COPY": true, "ADD": true, "SHELL": true, "VOLUME": true}

// directive is a parser directive, such as "# syntax=docker/dockerfile:1".
var directive = regexp.MustCompile(`^#\s*([A-Za-z]+)\s*=\s*(.*)$`)

// heredoc finds a here-document (RUN <<EOF), which Parse does not read.
var heredoc = regexp.MustCompile(`<<-?\s*["']?[A-Za-z_][A-Za-z0-9_]*["']?`)

// ParseFile parses the Dockerfile at path, naming it by its base name.
func ParseFile(path string) (*Dockerfile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("parse Dockerfile: %w", err)
	}
	defer f.Close()
	return Parse(filepath.Base(path), f)
}

// Parse reads a Dockerfile: comments, parser directives, continuation
// lines (a backslash at the end of a line) and the exec form of
// instructions, as Docker reads them. It refuses what it does not read the
// way Docker would: an escape directive other than the backslash, and
// here-documents.
func Parse(name string, r io.Reader) (*Dockerfile, error) {
	d := &Dockerfile{Name: name}
	fail := func(line int, format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", name, line, fmt.Sprintf(format, args...))
	}
	s := bufio.NewScanner(r)
	s.Buffer(nil, 1<<20)
	var (
		lineNo     int
		directives = true // parser directives come first, before anything else
		pending    strings.Builder
		start      int
	)
	for s.Scan() {
		lineNo++
		line := s.Text()
		trimmed := strings.TrimSpace(line)
		if directives {
			if m := directive.FindStringSubmatch(trimmed); m != nil {
				if strings.EqualFold(m[1], "escape") && strings.TrimSpace(m[2]) != `\` {
					return nil, fail(lineNo, "escape directive %q: only the backslash is supported", m[2])
				}
				continue
			}
			directives = false
		}
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && pending.Len() > 0) {
			continue // a comment, or an empty line inside a continued instruction
		}
		if trimmed == "" {
			continue
		}
		if pending.Len() == 0 {
			start = lineNo
		}
		if cont, ok := strings.CutSuffix(strings.TrimRightFunc(line, isSpace), `\`); ok {
			pending.WriteString(cont)
			continue
		}
		pending.WriteString(line)
		in, err := parseInstruction(start, pending.String())
		pending.Reset()
		if err != nil {
			return nil, fail(start, "%v", err)
		}
		if err := d.add(in); err != nil {
			return nil, fail(start, "%v", err)
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if pending.Len() > 0 {
		return nil, fail(start, "the last instruction ends with a line continuation")
	}
	if len(d.Stages) == 0 {
		return nil, fmt.Errorf("%s: no FROM instruction", name)
	}
	return d, nil
}

// add appends an instruction to the stage it belongs to.
func (d *Dockerfile) add(in Instruction) error {
	switch {
	case in.Keyword == "FROM":
		words := strings.Fields(in.Args)
		st := &Stage{Index: len(d.Stages), From: in}
		switch {
		case len(words) == 1:
		case len(words) == 3 && strings.EqualFold(words[1], "AS"):
			st.Name = strings.ToLower(words[2])
		default:
			return fmt.Errorf("FROM %s: want an image, optionally followed by AS name", in.Args)
		}
		d.Stages = append(d.Stages, st)
	case len(d.Stages) == 0 && in.Keyword == "ARG":
		d.Args = append(d.Args, in)
	case len(d.Stages) == 0:
		return fmt.Errorf("%s before the first FROM", in.Keyword)
	default:
		st := d.Stages[len(d.Stages)-1]
		st.Instructions = append(st.Instructions, in)
	}
	return nil
}

// parseInstruction splits an instruction, its continuation lines joined,
// into its keyword, flags and arguments.
func parseInstruction(line int, text string) (Instruction, error) {
	text = strings.TrimSpace(text)
	keyword, rest := text, ""
	if i := strings.IndexFunc(text, isSpace); i >= 0 {
		keyword, rest = text[:i], text[i:]
	}
	in := Instruction{Line: line, Keyword: strings.ToUpper(keyword)}
	rest = strings.TrimLeftFunc(rest, isSpace)
	if flagKeywords[in.Keyword] {
		for strings.HasPrefix(rest, "--") {
			end := strings.IndexFunc(rest, isSpace)
			if end < 0 {
				end = len(rest)
			}
			in.Flags = append(in.Flags, rest[:end])
			rest = strings.TrimLeftFunc(rest[end:], isSpace)
		}
	}
	in.Args = strings.TrimRightFunc(rest, isSpace)
	if execKeywords[in.Keyword] && strings.HasPrefix(in.Args, "[") {
		var elems []string
		if err := json.Unmarshal([]byte(in.Args), &elems); err == nil {
			in.Exec = elems
		}
	}
	if (in.Keyword == "RUN" || in.Keyword == "COPY" || in.Keyword == "ADD") && in.Exec == nil && heredoc.MatchString(in.Args) {
		return in, fmt.Errorf("%s: here-documents are not supported", in)
	}
	return in, nil
}

func isSpace(r rune) bool { return r == ' ' || r == '\t' || r == '\r' || r == '\n' }

// Final returns the last stage, the one the image is made of.
func (d *Dockerfile) Final() *Stage { return d.Stages[len(d.Stages)-1] }

// Stage returns the stage that ref names: a stage name, or an index.
func (d *Dockerfile) Stage(ref string) (*Stage, bool) {
	for _, st := range d.Stages {
		if (st.Name != "" && strings.EqualFold(st.Name, ref)) || fmt.Sprint(st.Index) == ref {
			return st, true
		}
	}
	return nil, false
}

// Last returns the stage's last instruction with the keyword, if any: the
// one in force for ENTRYPOINT, CMD, USER and the like.
func (st *Stage) Last(keyword string) (Instruction, bool) {
	for i := len(st.Instructions) - 1; i >= 0; i-- {
		if st.Instructions[i].Keyword == keyword {
			return st.Instructions[i], true
		}
	}
	return Instruction{}, false
}

// Image is the image or stage the stage starts from, as FROM names it:
// ${NAME} and the like not replaced (see Dockerfile.BaseImage).
func (st *Stage) Image() string { return strings.Fields(st.From.Args)[0] }

// BaseImage is the image or stage st starts from, the variables in its
// FROM replaced by the defaults of the ARGs before the first FROM, as a
// build given no --build-arg sees it.
func (d *Dockerfile) BaseImage(st *Stage) string { return expand(st.Image(), d.globalArgs()) }

// globalArgs returns the defaults of the ARGs before the first FROM.
func (d *Dockerfile) globalArgs() map[string]string {
	args := make(map[string]string)
	for _, in := range d.Args {
		for _, w := range splitWords(in.Args) {
			name, value, _ := strings.Cut(w, "=")
			args[name] = expand(value, args)
		}
	}
	return args
}

// Flag returns the value of the instruction's --name=value flag, if given.
func (in Instruction) Flag(name string) (string, bool) {
	for _, f := range in.Flags {
		if v, ok := strings.CutPrefix(f, "--"+name+"="); ok {
			return v, true
		}
		if f == "--"+name {
			return "", true
		}
	}
	return "", false
}
