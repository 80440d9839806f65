// Package jsonb knows what PostgreSQL's jsonb type accepts and how it
// compares values, so that a document can be checked, and two documents
// compared, before anything is sent to the database.
//
// PostgreSQL's jsonb accepts less than JSON allows. Check finds, in a valid
// JSON document, what jsonb would reject:
//
//   - invalid UTF-8;
//   - the escape \u0000, in any string or object key (jsonb cannot hold NUL);
//   - an unpaired UTF-16 surrogate escape such as "\ud800";
//   - a number outside PostgreSQL's numeric type: more than 131072 digits
//     before the decimal point, or more than 16383 after it (counting the
//     digits as written, so 0.10 has two).
//
// The escape checks read escapes, not bytes: the JSON string "\\u0000" is
// a backslash followed by "u0000", which jsonb stores as it is.
//
// CheckDuplicateKeys finds what jsonb accepts but does not keep: a key
// given twice in one object, of which jsonb stores only the last value.
// CheckAll finds both in one walk of the document.
package jsonb

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Error reports what in a document jsonb would reject, and where.
type Error struct {
	// Reason says what was found, as a noun phrase ("a NUL character").
	Reason string
	// Offset is the byte offset in the document where it starts.
	Offset int
	// Key is, for ReasonDuplicateKey, the key given twice, unescaped.
	Key string
}

func (e *Error) Error() string {
	if e.Reason == ReasonDuplicateKey {
		return fmt.Sprintf("contains the key %q twice in one object, at byte %d: jsonb would keep only the last value", e.Key, e.Offset)
	}
	return fmt.Sprintf("contains %s at byte %d", e.Reason, e.Offset)
}

// The reasons Check gives, and CheckDuplicateKeys its own.
const (
	ReasonInvalidUTF8  = "invalid UTF-8"
	ReasonNUL          = `a NUL character (\u0000), which PostgreSQL cannot store`
	ReasonSurrogate    = "an unpaired UTF-16 surrogate escape"
	ReasonNumber       = "a number PostgreSQL cannot store: at most 131072 digits before the decimal point and 16383 after it"
	ReasonBadEscape    = `an invalid \u escape`
	ReasonUnterminated = "an unterminated string"
	// ReasonDuplicateKey is the reason CheckDuplicateKeys gives, with the
	// key in Error.Key.
	ReasonDuplicateKey = "a key given twice in one object"
)

// Check returns an *Error for the first thing in b, a valid JSON document,
// that PostgreSQL's jsonb would reject, or nil if jsonb accepts it all.
func Check(b []byte) error {
	return check(b, false)
}

// CheckAll returns what Check returns for b, a valid JSON document, or, if
// that is nil, what CheckDuplicateKeys returns: an *Error for what jsonb
// would reject, or else for a key jsonb would not keep. It walks b once,
// where calling both walks it twice.
func CheckAll(b []byte) error {
	return check(b, true)
}

// check is Check, and, with keys, CheckAll, which notes the first
// duplicate key as it goes and returns it once nothing in the rest of b is
// rejected.
func check(b []byte, keys bool) error {
	if !utf8.Valid(b) {
		off := 0
		for off < len(b) {
			r, size := utf8.DecodeRune(b[off:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			off += size
		}
		return &Error{Reason: ReasonInvalidUTF8, Offset: off}
	}
	var keysBuf [2 * linearKeys]keySpan
	var objectsBuf [8]openObject
	d := duplicates{keys: keysBuf[:0], objects: objectsBuf[:0]}
	var doc string
	var dup error
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			end, err := checkString(b, i+1)
			if err != nil {
				return err
			}
			if keys && dup == nil {
				if key, isKey := spanOf(b, i, end); isKey {
					d, dup = d.add(b, &doc, key)
				}
			}
			i = end
		case keys && c == '{':
			d = d.open()
			i++
		case keys && c == '}':
			d = d.close()
			i++
		case c == '-' || isDigit(c):
			j := i + 1
			for j < len(b) && isNumberByte(b[j]) {
				j++
			}
			if !NumericFits(b[i:j]) {
				return &Error{Reason: ReasonNumber, Offset: i}
			}
			i = j
		default:
			i++
		}
	}
	return dup
}

// checkString checks the JSON string whose contents start at b[i] and
// returns the index just after its closing quote.
func checkString(b []byte, i int) (int, error) {
	for i < len(b) {
		switch b[i] {
		case '"':
			return i + 1, nil
		case '\\':
			if i+1 < len(b) && b[i+1] == 'u' {
				r, ok := hex4(b, i+2)
				if !ok {
					return 0, &Error{Reason: ReasonBadEscape, Offset: i}
				}
				switch {
				case r == 0:
					return 0, &Error{Reason: ReasonNUL, Offset: i}
				case r >= 0xD800 && r <= 0xDBFF:
					// A high surrogate must be followed by a low one.
					var lo rune
					if i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
						lo, ok = hex4(b, i+8)
					} else {
						ok = false
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return 0, &Error{Reason: ReasonSurrogate, Offset: i}
					}
					i += 12
					continue
				case r >= 0xDC00 && r <= 0xDFFF:
					return 0, &Error{Reason: ReasonSurrogate, Offset: i}
				}
				i += 6
				continue
			}
			i += 2
		default:
			i++
		}
	}
	return 0, &Error{Reason: ReasonUnterminated, Offset: len(b)}
}

// CheckDuplicateKeys returns an *Error with ReasonDuplicateKey for the
// first key in b, a valid JSON document, that is given a second time in
// the same object, at any depth, or nil if no object has a key twice.
// Keys are compared as jsonb compares them, after unescaping ("a" and
// "\u0061" are the same key) and byte for byte (no Unicode
// normalization). The Error's Offset is that of the key's second
// occurrence, so the first error is the one whose second occurrence comes
// first. b should be one that Check accepts: escapes that jsonb refuses,
// such as unpaired surrogates, may compare equal here.
//
// Check does not look for duplicate keys: jsonb accepts them, keeping the
// last value of each, which loses data that was sent. CheckAll looks for
// both.
func CheckDuplicateKeys(b []byte) error {
	var keysBuf [2 * linearKeys]keySpan
	var objectsBuf [8]openObject
	d := duplicates{keys: keysBuf[:0], objects: objectsBuf[:0]}
	var doc string
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '{':
			d = d.open()
		case '}':
			d = d.close()
		case '"':
			key, isKey := stringAt(b, i)
			i = key.end // the closing quote
			if !isKey {
				continue
			}
			var err error
			if d, err = d.add(b, &doc, key); err != nil {
				return err
			}
		}
	}
	return nil
}

// duplicates follows the keys of the objects a walk of a document is
// inside, to find a key given twice in one of them. A walk keeps it as a
// value, which its methods return changed: changed through a pointer, its
// slices would take the arrays they start in to the heap.
type duplicates struct {
	// keys of the open objects, innermost last, and the objects, kept in
	// arrays on the caller's stack while there are few: most documents
	// allocate nothing.
	keys    []keySpan
	objects []openObject
}

// open notes an object's opening brace.
func (d duplicates) open() duplicates {
	d.objects = append(d.objects, openObject{first: len(d.keys)})
	return d
}

// close notes an object's closing brace.
func (d duplicates) close() duplicates {
	if len(d.objects) > 0 {
		d.keys = d.keys[:d.objects[len(d.objects)-1].first]
		d.objects = d.objects[:len(d.objects)-1]
	}
	return d
}

// add notes key, a key of b, in the innermost open object, and returns an
// *Error with ReasonDuplicateKey if that object has it already. doc is b
// as a string, made for the first large object, so that the keys it holds
// are substrings rather than copies.
func (d duplicates) add(b []byte, doc *string, key keySpan) (duplicates, error) {
	if len(d.objects) == 0 {
		return d, nil
	}
	obj := &d.objects[len(d.objects)-1]
	if obj.seen == nil {
		for _, k := range d.keys[obj.first:] {
			if sameKey(b, k, key) {
				return d, &Error{Reason: ReasonDuplicateKey, Offset: key.start - 1, Key: key.text(b, *doc)}
			}
		}
		if len(d.keys)-obj.first < linearKeys {
			d.keys = append(d.keys, key)
			return d, nil
		}
		// A large object: look its keys up from now on.
		if *doc == "" {
			*doc = string(b)
		}
		obj.seen = make(map[string]struct{}, 4*linearKeys)
		for _, k := range d.keys[obj.first:] {
			obj.seen[k.text(b, *doc)] = struct{}{}
		}
	}
	text := key.text(b, *doc)
	if _, dup := obj.seen[text]; dup {
		return d, &Error{Reason: ReasonDuplicateKey, Offset: key.start - 1, Key: text}
	}
	obj.seen[text] = struct{}{}
	return d, nil
}

// linearKeys is how many keys an object may have before CheckDuplicateKeys
// looks them up in a map rather than comparing each new key with them all.
const linearKeys = 16

// keySpan is a JSON string of a document: its contents are b[start:end],
// between its quotes.
type keySpan struct {
	start, end int
	// escaped says whether it holds a backslash, and so whether its
	// contents differ from its text.
	escaped bool
}

// openObject is an object a walk for duplicates is inside: its keys are
// keys[first:], or, once it has more than linearKeys of them, seen.
type openObject struct {
	first int
	seen  map[string]struct{}
}

// stringAt returns the JSON string that starts with the quote b[i], and
// whether it is an object key: followed by a colon. Its end is found as
// Check finds it (checkString); a string Check would refuse ends the
// document.
func stringAt(b []byte, i int) (keySpan, bool) {
	end, err := checkString(b, i+1)
	if err != nil {
		return keySpan{start: i + 1, end: len(b)}, false
	}
	return spanOf(b, i, end)
}

// spanOf returns the JSON string b[i:end], quotes included, and whether it
// is an object key: followed by a colon.
func spanOf(b []byte, i, end int) (keySpan, bool) {
	k := keySpan{start: i + 1, end: end - 1}
	k.escaped = bytes.IndexByte(b[k.start:k.end], '\\') >= 0
	for j := end; j < len(b); j++ {
		switch b[j] {
		case ' ', '\t', '\n', '\r':
			continue
		case ':':
			return k, true
		}
		break
	}
	return k, false
}

// text returns the key's contents, unescaped: a substring of doc, b as a
// string, unless doc is empty or the key has escapes.
func (k keySpan) text(b []byte, doc string) string {
	switch {
	case !k.escaped && doc != "":
		return doc[k.start:k.end]
	case !k.escaped:
		return string(b[k.start:k.end])
	}
	var s string
	if err := json.Unmarshal(b[k.start-1:k.end+1], &s); err != nil {
		return string(b[k.start:k.end]) // not valid JSON: compare as written
	}
	return s
}

// sameKey reports whether two keys of b are equal once unescaped.
func sameKey(b []byte, x, y keySpan) bool {
	if !x.escaped && !y.escaped {
		return bytes.Equal(b[x.start:x.end], b[y.start:y.end])
	}
	return x.text(b, "") == y.text(b, "")
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	return rune(v), true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isNumberByte(c byte) bool {
	return isDigit(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// PostgreSQL's numeric limits: its weight (in base-10000 digits) and
// display scale are stored in 16 and 14 bits.
const (
	numericMaxWeight = 131071 // highest power of ten of a leading digit
	numericMaxScale  = 16383  // digits after the decimal point
	numericMaxExp    = 1<<30 - 1
)

// NumericFits reports whether PostgreSQL's numeric accepts the JSON number
// s, following its input function: the scale is the number of digits
// written after the point minus the exponent, and the leading significant
// digit may be at most 10^131071.
func NumericFits(s []byte) bool {
	n, ok := parseNumber(s)
	if !ok {
		return false
	}
	if n.exp >= numericMaxExp || n.exp <= -numericMaxExp {
		return false
	}
	if scale := int64(len(n.frac)) - n.exp; scale > numericMaxScale {
		return false
	}
	digits := n.intPart + n.frac
	lead := strings.IndexFunc(digits, func(r rune) bool { return r != '0' })
	if lead < 0 {
		return true // zero
	}
	weight := int64(len(n.intPart)-1-lead) + n.exp
	return weight <= numericMaxWeight
}

// number is a JSON number split into its parts.
type number struct {
	neg     bool
	intPart string
	frac    string
	exp     int64
}

func parseNumber(s []byte) (number, bool) {
	var n number
	str := string(s)
	if strings.HasPrefix(str, "-") {
		n.neg = true
		str = str[1:]
	}
	mant, expStr, hasExp := strings.Cut(strings.ToLower(str), "e")
	n.intPart, n.frac, _ = strings.Cut(mant, ".")
	if hasExp {
		expStr = strings.TrimPrefix(expStr, "+")
		neg := strings.HasPrefix(expStr, "-")
		digits := strings.TrimLeft(strings.TrimPrefix(expStr, "-"), "0")
		if len(digits) > 12 {
			return n, false
		}
		if digits != "" {
			e, err := strconv.ParseInt(digits, 10, 64)
			if err != nil {
				return n, false
			}
			n.exp = e
		}
		if neg {
			n.exp = -n.exp
		}
	}
	return n, true
}

// canonicalNumber returns a form of the JSON number s that is equal for
// numbers of equal value, as jsonb compares them: 1, 1.0 and 0.1e1 are all
// "1e0"; 0 and -0 are "0".
func canonicalNumber(s string) (string, bool) {
	n, ok := parseNumber([]byte(s))
	if !ok {
		return "", false
	}
	digits := n.intPart + n.frac
	exp := n.exp - int64(len(n.frac))
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0", true
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	sign := ""
	if n.neg {
		sign = "-"
	}
	return sign + trimmed + "e" + strconv.FormatInt(exp, 10), true
}

// Equal reports whether two JSON documents are equal as jsonb values:
// object key order, whitespace and the spelling of numbers do not matter,
// and of keys given twice the last counts. An empty document counts as
// null, which is how a jsonb null comes back from the database.
func Equal(a, b []byte) bool {
	va, okA := decodeAny(a)
	vb, okB := decodeAny(b)
	return okA && okB && equalValues(va, vb)
}

func decodeAny(b []byte) (any, bool) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, true
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	return v, true
}

func equalValues(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok || !equalValues(va, vb) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !equalValues(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		ca, okA := canonicalNumber(string(a))
		cb, okB := canonicalNumber(string(b))
		return okA && okB && ca == cb
	default: // string, bool, nil
		return a == b
	}
}

// MaxDecodeDepth is how deep encoding/json reads a document's arrays and
// objects; it refuses one nested deeper.
const MaxDecodeDepth = 10000

// Depth returns how deep the arrays and objects of b, a JSON document that
// may be invalid, nest at their deepest, counting the brackets outside
// strings.
func Depth(b []byte) int {
	deepest := 0
	var r reader
	for _, c := range b {
		r.step(c)
		deepest = max(deepest, r.depth)
	}
	return deepest
}

// ArrayLen returns how many elements b, a valid JSON document, holds if it
// is an array, at any depth, or 0 if it is not an array.
func ArrayLen(b []byte) int {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != '[' {
		return 0
	}
	if rest := bytes.TrimLeft(b[1:], " \t\r\n"); len(rest) > 0 && rest[0] == ']' {
		return 0
	}
	commas := 0
	var r reader
	for _, c := range b {
		if r.step(c) && c == ',' && r.depth == 1 {
			commas++
		}
	}
	return commas + 1
}

// AppendCompact appends b, a valid JSON document, to dst as json.Marshal
// writes a json.RawMessage, at any depth: without the white space outside
// its strings, and with <, >, &, U+2028 and U+2029 escaped as \u003c,
// \u003e, \u0026, \u2028 and \u2029. encoding/json refuses a document
// nested deeper than MaxDecodeDepth, which jsonb holds.
func AppendCompact(dst, b []byte) []byte {
	const hex = "0123456789abcdef"
	var r reader
	for i := 0; i < len(b); i++ {
		c := b[i]
		if r.step(c) && (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
			continue
		}
		switch {
		case c == '<' || c == '>' || c == '&':
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		case c == 0xE2 && i+2 < len(b) && b[i+1] == 0x80 && b[i+2]&^1 == 0xA8:
			// U+2028 or U+2029, whose continuation bytes change nothing
			// the reader follows.
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[b[i+2]&0xF])
			i += 2
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// reader follows a JSON document byte by byte: whether the byte lies in
// a string, and how deep in arrays and objects it lies.
type reader struct {
	inString, escaped bool
	depth             int
}

// step reads c, the document's next byte, and reports whether it lies
// outside the document's strings (a string's quotes lie in it). The
// depth counts the brackets outside strings read so far.
func (r *reader) step(c byte) bool {
	switch {
	case r.escaped:
		r.escaped = false
	case r.inString && c == '\\':
		r.escaped = true
	case c == '"':
		r.inString = !r.inString
	case r.inString:
	case c == '[' || c == '{':
		r.depth++
		return true
	case c == ']' || c == '}':
		r.depth--
		return true
	default:
		return true
	}
	return false
}
