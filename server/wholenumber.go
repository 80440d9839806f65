package server

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// wholeFields names the fields wholeField reads: the API's integers.
var wholeFields = map[string]bool{"priority": true, "max_attempts": true}

// wholeField reads the integer field named field from its JSON value, raw.
// Like JSON Schema's "integer", it takes any JSON number whose value is
// whole: 3, 3.0, 3e0 and 30e-1 alike, as clients whose numbers are all
// floating point send them. 3.5, a value beyond int64, and anything but a
// number are refused with a 400 naming the field. An absent or null field
// is nil. The field is read here rather than by the JSON decoder, so that
// its error names it whichever implementation of encoding/json the server
// is built with.
func wholeField(field string, raw json.RawMessage) (*int64, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	v, ok := parseWhole(string(raw))
	if !ok {
		return nil, badRequest(field, "%s must be %s", field, fieldTypes[field])
	}
	return &v, nil
}

// parseWhole returns the value of the JSON number s if it is a whole
// number that fits an int64. It reads the number's decimal digits
// exactly, never through a float, so 1.0000000000000000001 is not whole,
// and an exponent of any length costs no more than its digits.
func parseWhole(s string) (int64, bool) {
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return v, true
	} else if errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	sign := ""
	if rest, ok := strings.CutPrefix(s, "-"); ok {
		sign, s = "-", rest
	}
	mantissa, exponent, hasExponent := strings.Cut(strings.ToLower(s), "e")
	whole, fraction, _ := strings.Cut(mantissa, ".")
	if !isDigits(whole) || (fraction != "" && !isDigits(fraction)) {
		return 0, false
	}
	// The value is digits × 10^exp, digits without leading or trailing
	// zeros: zero whatever its exponent.
	digits := strings.TrimLeft(whole+fraction, "0")
	if digits == "" {
		return 0, true
	}
	var exp int64
	if hasExponent {
		var err error
		exp, err = strconv.ParseInt(exponent, 10, 64)
		// Beyond that, a number no request can hold digits enough to
		// balance is a fraction or too large either way; within it, the
		// sums below cannot overflow.
		if err != nil || exp < -maxExponent || exp > maxExponent {
			return 0, false
		}
	}
	exp -= int64(len(fraction))
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	digits = trimmed
	if exp < 0 || exp > int64(19-len(digits)) {
		return 0, false // a fraction, or beyond int64
	}
	v, err := strconv.ParseInt(sign+digits+strings.Repeat("0", int(exp)), 10, 64)
	if err != nil {
		return 0, false
	}
	return v, true
}

// maxExponent bounds the exponents parseWhole reads: far more than the
// digits of any request body.
const maxExponent = 1 << 40

// isDigits reports whether s is one or more ASCII digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
