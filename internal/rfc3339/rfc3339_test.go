package rfc3339_test

import (
	"testing"
	"time"

	"github.com/relayq/relay/internal/rfc3339"
)

func TestParse_TakesWhatRFC3339DefinesAndNothingElse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Time // zero: refused
	}{
		{"2030-01-02T15:04:05Z", time.Date(2030, 1, 2, 15, 4, 5, 0, time.UTC)},
		{"2030-01-02t15:04:05z", time.Date(2030, 1, 2, 15, 4, 5, 0, time.UTC)},
		{"2030-01-02T15:04:05.123456789Z", time.Date(2030, 1, 2, 15, 4, 5, 123456789, time.UTC)},
		{"2030-01-02T15:04:05+05:30", time.Date(2030, 1, 2, 9, 34, 5, 0, time.UTC)},
		{"2030-01-02T15:04:05-23:59", time.Date(2030, 1, 3, 15, 3, 5, 0, time.UTC)},
		{"2030-01-02T15:04:05+24:00", time.Time{}},
		{"2030-01-02T15:04:05+23:60", time.Time{}},
		{"2030-01-02T15:04:05,5Z", time.Time{}},
		{"2030-12-31T23:59:60Z", time.Time{}},
		{"2030-01-02 15:04:05Z", time.Time{}},
		{"2030-01-02T15:04:05", time.Time{}},
		{"2030-01-02T15:04Z", time.Time{}},
		{"2030-02-30T15:04:05Z", time.Time{}},
		{"2030-01-02T25:04:05Z", time.Time{}},
		{"2030-01-02T15:04:05Z ", time.Time{}},
		{"", time.Time{}},
	} {
		got, err := rfc3339.Parse(tc.in)
		switch {
		case tc.want.IsZero() && err == nil:
			t.Errorf("Parse(%q) = %v, want an error", tc.in, got)
		case !tc.want.IsZero() && err != nil:
			t.Errorf("Parse(%q): %v", tc.in, err)
		case !tc.want.IsZero() && !got.Equal(tc.want):
			t.Errorf("Parse(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
