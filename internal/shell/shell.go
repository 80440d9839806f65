// Package shell writes words for a POSIX shell, for the commands that Relay
// prints for people to copy and paste.
package shell

import (
	"regexp"
	"strings"
)

// safe matches a word that a POSIX shell reads as itself without quotes.
var safe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// Quote returns s as one word for a POSIX shell: as it is if nothing in it
// is special, else in single quotes.
func Quote(s string) string {
	if safe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
