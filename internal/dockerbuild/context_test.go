package dockerbuild

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// writeTree makes the files, each with its name as its contents, under a
// new directory, and returns it.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// contextFiles copies the context of dir and lists the files it holds.
func contextFiles(t *testing.T, dir string) []string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "context")
	if err := CopyContext(dst, dir, filepath.Join(dir, "Dockerfile")); err != nil {
		t.Fatalf("CopyContext: %v", err)
	}
	var files []string
	err := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dst, p)
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

func TestCopyContext_LeavesOutWhatTheIgnoreFileExcludesAsDockerDoes(t *testing.T) {
	dir := writeTree(t, map[string]string{
		".dockerignore": `# comments and blank lines are skipped

/.git
docs
**/*.test
cmd/*/testdata
secret*
!secret.example
Dockerfile
.dockerignore
`,
		"Dockerfile":                     "FROM scratch",
		".git/HEAD":                      "ref",
		"go.mod":                         "module x",
		"docs/guide.md":                  "guide",
		"cmd/relay/main.go":              "package main",
		"cmd/relay/relay.test":           "binary",
		"cmd/relay/testdata/golden.json": "{}",
		"internal/docs/keep.go":          "package docs", // docs matches at the root only
		"internal/x/x.test":              "binary",
		"secret.key":                     "key",
		"secret.example":                 "example",
	})
	got := contextFiles(t, dir)
	want := []string{"cmd/relay/main.go", "go.mod", "internal/docs/keep.go", "secret.example"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("context files (-want +got):\n%s", diff)
	}
}

func TestCopyContext_TakesBackAnExceptionInsideAnExcludedDirectory(t *testing.T) {
	dir := writeTree(t, map[string]string{
		".dockerignore":           "experiment\n!experiment/schema/*.sql\n",
		"experiment/lab.go":       "package experiment",
		"experiment/schema/a":     "a",
		"experiment/schema/b.sql": "b",
		"go.mod":                  "module x",
	})
	got := contextFiles(t, dir)
	want := []string{".dockerignore", "experiment/schema/b.sql", "go.mod"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("context files (-want +got):\n%s", diff)
	}
}

func TestCopyContext_PrefersTheIgnoreFileBesideTheDockerfile(t *testing.T) {
	dir := writeTree(t, map[string]string{
		".dockerignore":           "a\n",
		"Dockerfile.dockerignore": "b\n",
		"a":                       "a",
		"b":                       "b",
	})
	got := contextFiles(t, dir)
	want := []string{".dockerignore", "Dockerfile.dockerignore", "a"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("context files (-want +got):\n%s", diff)
	}
}

func TestCopyContext_KeepsSymbolicLinksAndPermissions(t *testing.T) {
	dir := writeTree(t, map[string]string{"run.sh": "#!/bin/sh\n"})
	if err := os.Chmod(filepath.Join(dir, "run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("run.sh", filepath.Join(dir, "start")); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "context")
	if err := CopyContext(dst, dir, filepath.Join(dir, "Dockerfile")); err != nil {
		t.Fatalf("CopyContext: %v", err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "start")); err != nil || target != "run.sh" {
		t.Errorf("start links to %q (%v), want run.sh", target, err)
	}
	if info, err := os.Stat(filepath.Join(dst, "run.sh")); err != nil || info.Mode().Perm() != 0o755 {
		t.Errorf("run.sh: %v, %v; want mode 0755", info.Mode(), err)
	}
}
