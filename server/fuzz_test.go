package server

import (
	"encoding/json"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/relayq/relay/internal/dbtest"
)

// FuzzEnqueue sends arbitrary bodies and Idempotency-Key headers to
// POST /v1/jobs. Whatever the input, the API must not panic nor answer 5xx,
// every answer must be JSON, and a rejected request must write nothing. The
// seed corpus in testdata/fuzz/FuzzEnqueue covers valid requests, NUL
// characters, invalid UTF-8, trailing data, unknown fields and huge numbers;
// plain `go test` runs only those seeds.
//
//	go test -fuzz=FuzzEnqueue ./server/
func FuzzEnqueue(f *testing.F) {
	e := setup(f)
	f.Add([]byte(`{"kind":"a"}`), "")
	f.Fuzz(func(t *testing.T, body []byte, key string) {
		var headers []string
		if key != "" {
			headers = []string{"Idempotency-Key", key}
		}
		before := dbtest.CountJobs(t, e.pool)
		rec := e.do(t, "POST", "/v1/jobs", string(body), headers...)
		after := dbtest.CountJobs(t, e.pool)

		if rec.Code >= 500 {
			t.Fatalf("status %d for body %q key %q: %s", rec.Code, body, key, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("Content-Type %q for body %q", ct, body)
		}
		switch rec.Code {
		case http.StatusCreated:
			var job JobView
			if err := json.Unmarshal(rec.Body.Bytes(), &job); err != nil || job.ID <= 0 || job.Kind == "" {
				t.Fatalf("201 without a job: %v: %s", err, rec.Body)
			}
			if after != before+1 {
				t.Fatalf("201 but %d jobs became %d", before, after)
			}
		case http.StatusOK: // an idempotent replay
			if key == "" {
				t.Fatalf("200 without an Idempotency-Key for body %q", body)
			}
			if after != before {
				t.Fatalf("replay wrote: %d jobs became %d", before, after)
			}
		default:
			var eb errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error == "" {
				t.Fatalf("status %d without a JSON error: %v: %s", rec.Code, err, rec.Body)
			}
			if after != before {
				t.Fatalf("status %d but %d jobs became %d, for body %q key %q", rec.Code, before, after, body, key)
			}
		}
	})
}

// FuzzParseWhole checks parseWhole against math/big on every JSON number:
// it must take exactly those whose value is whole and fits an int64, with
// that value, and never panic, whatever the exponent. A number whose
// exponent big.Rat would take long to expand is whole only if its digits
// are all zeros, or it would be far beyond int64 or a fraction.
//
//	go test -run '^$' -fuzz=FuzzParseWhole ./server/
func FuzzParseWhole(f *testing.F) {
	for _, s := range []string{"7", "7.0", "70e-1", "-0.0", "1.5", "1e19", "9223372036854775807.0",
		"-9.223372036854775808e18", "1e9223372036854775807", "1.5e-9223372036854775808", "0e-99999", "5e-2000", `"7"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseWhole(s)
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil || dec.InputOffset() != int64(len(s)) || strings.TrimSpace(s) != s {
			return // the decoder hands parseWhole one value's own bytes
		}
		if _, isNumber := v.(json.Number); !isNumber {
			if ok {
				t.Fatalf("parseWhole(%s) = %d, true for a JSON value that is not a number", s, got)
			}
			return
		}
		mantissa, exponent, _ := strings.Cut(strings.ToLower(s), "e")
		if e, err := strconv.Atoi(exponent); exponent != "" && (err != nil || e > 1000 || e < -1000) {
			zero := strings.Trim(strings.TrimPrefix(mantissa, "-"), "0.") == ""
			if ok != zero || got != 0 {
				t.Fatalf("parseWhole(%s) = %d, %t; want 0, %t", s, got, ok, zero)
			}
			return
		}
		r, valid := new(big.Rat).SetString(s)
		if !valid {
			t.Fatalf("big.Rat cannot read the JSON number %s", s)
		}
		want := r.IsInt() && r.Num().IsInt64()
		if ok != want || (ok && got != r.Num().Int64()) {
			t.Fatalf("parseWhole(%s) = %d, %t; want %s, %t", s, got, ok, r.RatString(), want)
		}
	})
}
