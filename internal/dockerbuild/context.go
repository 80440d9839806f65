package dockerbuild

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// ignoreFile returns the path of the file that holds the exclusion
// patterns of the build context dir for the Dockerfile at dockerfile:
// <Dockerfile>.dockerignore beside the Dockerfile if there is one, as
// BuildKit prefers it, else .dockerignore at the root of the context. The
// file need not exist.
func ignoreFile(dir, dockerfile string) string {
	if beside := dockerfile + ".dockerignore"; pathExists(beside) {
		return beside
	}
	return filepath.Join(dir, ".dockerignore")
}

// readIgnoreFile returns the matcher, the one Docker itself uses, of the
// patterns in the ignore file at path; a missing file excludes nothing.
func readIgnoreFile(path string) (*patternmatcher.PatternMatcher, error) {
	var patterns []string
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read the ignore file: %w", err)
	default:
		defer f.Close()
		if patterns, err = ignorefile.ReadAll(f); err != nil {
			return nil, fmt.Errorf("read the ignore file %s: %w", path, err)
		}
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, fmt.Errorf("compile the patterns of %s: %w", path, err)
	}
	return pm, nil
}

// CopyContext copies to dst, which must not exist or be empty, the build
// context that Docker sends for the directory dir and the Dockerfile at
// dockerfile: every file under dir that the ignore file does not exclude
// (<Dockerfile>.dockerignore beside the Dockerfile, else .dockerignore).
// An excluded Dockerfile or .dockerignore is left out too: Docker reads
// them, but COPY does not see them. CopyContext walks dir as the docker
// CLI does when it archives a context, skipping an excluded directory
// unless an exception ("!path") may take back something inside it.
// Directories, regular files and symbolic links are copied with their
// permissions; nothing else is.
func CopyContext(dst, dir, dockerfile string) error {
	pm, err := readIgnoreFile(ignoreFile(dir, dockerfile))
	if err != nil {
		return fmt.Errorf("copy the build context: %w", err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("copy the build context: %w", err)
	}
	var (
		parentDirs []string
		parentInfo []patternmatcher.MatchInfo
	)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walk
			}
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		// The matcher takes the results for the nearest parent directory,
		// as the docker CLI's walk gives them.
		for len(parentDirs) > 0 && !strings.HasPrefix(rel, parentDirs[len(parentDirs)-1]+string(filepath.Separator)) {
			parentDirs, parentInfo = parentDirs[:len(parentDirs)-1], parentInfo[:len(parentInfo)-1]
		}
		var parent patternmatcher.MatchInfo
		if len(parentInfo) > 0 {
			parent = parentInfo[len(parentInfo)-1]
		}
		excluded, info, err := pm.MatchesUsingParentResults(filepath.ToSlash(rel), parent)
		if err != nil {
			return fmt.Errorf("match %s against the ignore patterns: %w", rel, err)
		}
		if d.IsDir() {
			parentDirs, parentInfo = append(parentDirs, rel), append(parentInfo, info)
		}
		if excluded {
			if d.IsDir() && !mayTakeBack(pm, rel) {
				return filepath.SkipDir
			}
			return nil
		}
		return copyEntry(filepath.Join(dst, rel), path, d)
	})
	if err != nil {
		return fmt.Errorf("copy the build context %s: %w", dir, err)
	}
	return nil
}

// mayTakeBack reports whether an exception pattern may include something
// inside the excluded directory rel, so that the walk must enter it.
func mayTakeBack(pm *patternmatcher.PatternMatcher, rel string) bool {
	if !pm.Exclusions() {
		return false
	}
	dirSlash := filepath.ToSlash(rel) + "/"
	for _, p := range pm.Patterns() {
		if p.Exclusion() && strings.HasPrefix(p.String()+"/", dirSlash) {
			return true
		}
	}
	return false
}

// copyEntry copies one directory entry at src to dst: a directory is made,
// a regular file copied, a symbolic link made again; the directories above
// dst are made as needed, since an exception may take back a file whose
// directory the patterns exclude.
func copyEntry(dst, src string, d fs.DirEntry) error {
	info, err := d.Info()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch mode := info.Mode(); {
	case mode.IsDir():
		return os.MkdirAll(dst, mode.Perm()|0o700)
	case mode.IsRegular():
		return copyFile(dst, src, mode.Perm())
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	default:
		return nil // sockets, pipes, devices: not part of a context
	}
}

// copyFile copies the regular file src to dst, with mode perm.
func copyFile(dst, src string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
