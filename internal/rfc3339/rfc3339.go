// Package rfc3339 parses timestamps as RFC 3339 defines them. Go's
// time.RFC3339 layout differs from the RFC both ways: it accepts a UTC
// offset of +24:00, which moves the time by a day, and a comma before the
// fraction, and it refuses the lowercase "t" and "z" the RFC allows.
package rfc3339

import (
	"errors"
	"regexp"
	"strings"
	"time"
)

// dateTime is RFC 3339's date-time (section 5.6): full-date "T"
// full-time, with a fraction of any length and an offset of Z or ±hh:mm.
var dateTime = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:(\d{2})(\.\d+)?([Zz]|[+-](\d{2}):(\d{2}))$`)

// ErrSyntax is the error of a text that is not an RFC 3339 date-time.
var ErrSyntax = errors.New("not an RFC 3339 timestamp such as 2030-01-02T15:04:05Z")

// Parse parses s, an RFC 3339 date-time. Besides what the RFC refuses, it
// refuses a leap second (a seconds field of 60), which time.Time cannot
// hold, and an offset whose hours exceed 23 or minutes 59, which the RFC's
// grammar admits but no time zone has.
func Parse(s string) (time.Time, error) {
	m := dateTime.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, ErrSyntax
	}
	if m[1] == "60" {
		return time.Time{}, errors.New("a leap second (a seconds field of 60) is not supported")
	}
	if m[4] != "" && (m[4] > "23" || m[5] > "59") {
		return time.Time{}, errors.New("a UTC offset is at most 23:59")
	}
	// Only the "T" and the "Z" can be lowercase in a text that matched.
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(s))
	if err != nil {
		return time.Time{}, ErrSyntax
	}
	return t, nil
}
