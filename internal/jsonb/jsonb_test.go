package jsonb

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/relayq/relay/internal/dbtest"
)

// The checks of this package promise to reject exactly what jsonb rejects;
// these tests hold them to it against the real database.

func TestNumericFits_AgreesWithPostgres(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	numbers := []string{
		"0", "-0", "1", "-1", "1.5", "0.000", "1e0", "1E+2", "1e-2", "0e999999", "0e1073741822", "0e1073741823",
		"1e131071", "9e131071", "9.9e131071", "1e131072", "10e131071", "0.1e131072", "0.01e131073",
		"1e-16383", "1e-16384", "1.5e-16383", "0.5e-16382", "0.00000e-20000", "0e-16383", "0e-16384",
		"123456789012345678901234567890", "-1.000000000000000000000000001",
		strings.Repeat("9", 131072), strings.Repeat("9", 131073), "0." + strings.Repeat("1", 16383), "0." + strings.Repeat("1", 16384),
		"1e99999999999", "1e-99999999999", "1e9999999999999999999999", "0e-9999999999999",
	}
	for _, n := range numbers {
		name := n
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		t.Run(name, func(t *testing.T) {
			_, dbErr := pool.Exec(context.Background(), "SELECT $1::text::jsonb", n)
			if got, want := NumericFits([]byte(n)), dbErr == nil; got != want {
				t.Errorf("NumericFits = %v, PostgreSQL accepts it: %v (%v)", got, want, dbErr)
			}
		})
	}
}

func TestCheck_AgreesWithPostgres(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	payloads := []string{
		`"plain"`, `"\u0000"`, `"a\u0000"`, `{"\u0000":1}`, `"\\u0000"`, `"\\\u0000"`, `"\\\\u0000"`,
		`"\ud83d\ude00"`, `"\ud800"`, `"\udc00"`, `"\ud800x"`, `"\ud800\u0041"`, `"\ud800\ud800"`, `"\ude00\ud83d"`,
		`"\uD83D\uDE00"`, `"\u00e9"`, `"\uffff"`, `"\/\b\f\n\r\t\""`, `["\u0001", {"k": "\u001f"}]`,
		`[1, -2.5e3, {"a": [true, false, null]}]`, `{"a": "x", "a": "\u0000"}`,
		`[1e200000]`, `{"n": -1e-20000}`, `"caf\u00e9 \\ud800"`, "\"\xff\"", "[\"ok\", \"\xc3\"]",
	}
	for _, p := range payloads {
		t.Run(p, func(t *testing.T) {
			_, dbErr := pool.Exec(context.Background(), "SELECT $1::text::jsonb", p)
			err := Check([]byte(p))
			if got, want := err == nil, dbErr == nil; got != want {
				t.Errorf("Check: %v; PostgreSQL: %v", err, dbErr)
			}
		})
	}
}

func TestEqual_AgreesWithJSONBEquality(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	pairs := [][2]string{
		{`{}`, `{}`},
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{`{"a":1}`, `{"a":1.0}`},
		{`{"a":1}`, `{"a":1.01}`},
		{`[1e2]`, `[100]`},
		{`[0.1e1]`, `[1]`},
		{`[-0]`, `[0]`},
		{`[0.0]`, `[0e5]`},
		{`[1,2]`, `[2,1]`},
		{`[1]`, `["1"]`},
		{`null`, `{}`},
		{`null`, `null`},
		{`{"a":null}`, `{}`},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`{"a":1,"a":2}`, `{"a":1}`},
		{`"\u00e9"`, `"é"`},
		{`{"x":[1,{"y":true}]}`, `{ "x" : [ 1 , { "y" : true } ] }`},
		{`[12345678901234567890.000]`, `[1.234567890123456789e19]`},
		{`[-1.5]`, `[-15e-1]`},
		{`[1.5]`, `[-1.5]`},
		{`true`, `false`},
	}
	for _, p := range pairs {
		t.Run(p[0]+" vs "+p[1], func(t *testing.T) {
			var want bool
			if err := pool.QueryRow(context.Background(), "SELECT $1::text::jsonb = $2::text::jsonb", p[0], p[1]).Scan(&want); err != nil {
				t.Fatal(err)
			}
			if got := Equal([]byte(p[0]), []byte(p[1])); got != want {
				t.Errorf("Equal = %v, jsonb says %v", got, want)
			}
		})
	}
}

func TestCheck_SaysWhatAndWhere(t *testing.T) {
	tests := []struct {
		doc    string
		reason string
		offset int
	}{
		{`{"a": "\ud800"}`, ReasonSurrogate, 7},
		{`["ok", "x\u0000"]`, ReasonNUL, 9},
		{`{"n": 1e200000}`, ReasonNumber, 6},
		{"[\"ok\", \"\xc3\"]", ReasonInvalidUTF8, 8},
		{`"\u12"`, ReasonBadEscape, 1},
	}
	for _, tt := range tests {
		err := Check([]byte(tt.doc))
		var e *Error
		if !errors.As(err, &e) || e.Reason != tt.reason || e.Offset != tt.offset {
			t.Errorf("Check(%q) = %v, want %q at byte %d", tt.doc, err, tt.reason, tt.offset)
		}
	}
	if err := Check([]byte(`{"path": "C:\\u0000", "emoji": "\ud83d\ude00"}`)); err != nil {
		t.Errorf("Check refused an escaped backslash before u0000 and a surrogate pair: %v", err)
	}
}
