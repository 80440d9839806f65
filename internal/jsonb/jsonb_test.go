package jsonb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

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

func TestCheckDuplicateKeys_AgreesWithPostgres(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	many := func(last string) string { // an object past the keys compared one by one
		var sb strings.Builder
		sb.WriteString(`{`)
		for i := range 40 {
			fmt.Fprintf(&sb, `"k%d":%d,`, i, i)
		}
		return sb.String() + last + `:0}`
	}
	docs := []string{
		`{}`, `[]`, `1`, `"a"`, `null`, `{"a":1}`, `{"a":1,"b":2}`, `{"a":1,"A":2}`,
		`{"a":1,"a":2}`, `{"a":1,"b":2,"a":1}`, `{"a":1,"\u0061":2}`, `{"\u0061":1,"a":2}`, `{"\u0061":1,"\u0061":2}`,
		`{"é":1,"\u00e9":2}`, `{"e\u0301":1,"é":2}`, `{"\/":1,"/":2}`, `{"\\":1,"\u005c":2}`, `{"\ud83d\ude00":1,"😀":2}`,
		`{"":1,"":2}`, `{"a" : 1, "a"	:2}`, `{"a":"a","b":"a"}`, `["a","a"]`, `{"a":["a","a"]}`,
		`{"a":{"a":1}}`, `{"a":{"b":1},"c":{"b":2}}`, `[{"a":1},{"a":1}]`, `{"x":[{"y":1,"y":2}]}`,
		`{"a":{"b":{"c":1}},"a":2}`, `{"a":{"b":1,"c":{"d":1},"b":2}}`, `{"a":"{\"a\":1,\"a\":2}"}`,
		`{"a:":1,"a":2}`, `{"a":1,"b":{},"a":2}`,
		many(`"k7"`), many(`"k40"`), many(`"k\u0037"`), many(`"\u006b7"`), `[` + many(`"k0"`) + `]`,
	}
	for _, d := range docs {
		name := d
		if len(name) > 40 {
			name = name[len(name)-40:]
		}
		t.Run(name, func(t *testing.T) {
			// json keeps every key and jsonb the last of each: their trees
			// have as many nodes exactly when no object has a key twice.
			var dropped bool
			err := pool.QueryRow(context.Background(), `
				WITH RECURSIVE j(v) AS (
					SELECT $1::text::json
					UNION ALL
					SELECT c FROM j, LATERAL (
						SELECT value FROM json_each(CASE WHEN json_typeof(j.v) = 'object' THEN j.v END)
						UNION ALL SELECT value FROM json_array_elements(CASE WHEN json_typeof(j.v) = 'array' THEN j.v END)
					) AS children(c)
				), jb(v) AS (
					SELECT $1::text::jsonb
					UNION ALL
					SELECT c FROM jb, LATERAL (
						SELECT value FROM jsonb_each(CASE WHEN jsonb_typeof(jb.v) = 'object' THEN jb.v END)
						UNION ALL SELECT value FROM jsonb_array_elements(CASE WHEN jsonb_typeof(jb.v) = 'array' THEN jb.v END)
					) AS children(c)
				)
				SELECT (SELECT count(*) FROM j) <> (SELECT count(*) FROM jb)`, d).Scan(&dropped)
			if err != nil {
				t.Fatal(err)
			}
			err = CheckDuplicateKeys([]byte(d))
			if got := err != nil; got != dropped {
				t.Errorf("CheckDuplicateKeys: %v; PostgreSQL drops a key: %v", err, dropped)
			}
		})
	}
}

func TestCheckDuplicateKeys_SaysWhichKeyAndWhere(t *testing.T) {
	tests := []struct {
		doc    string
		key    string
		offset int
	}{
		{`{"amount":100,"amount":1}`, "amount", 14},
		{`{"a":1,"\u0061":2}`, "a", 7},
		{`{"\u0061":1,"a":2}`, "a", 12},
		{`[{"ok":1},{"x":{"y":1,"y":2}}]`, "y", 22},
		// The duplicate whose second occurrence comes first, the inner one
		// here, although the outer object's first "a" comes before.
		{`{"a":{"b":1,"b":2},"a":3}`, "b", 12},
		{`{"":1,"":2}`, "", 6},
		{`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k\u0031":1}`, "k1", 143},
	}
	for _, tt := range tests {
		err := CheckDuplicateKeys([]byte(tt.doc))
		var e *Error
		if !errors.As(err, &e) || e.Reason != ReasonDuplicateKey || e.Key != tt.key || e.Offset != tt.offset {
			t.Errorf("CheckDuplicateKeys(%s) = %#v, want key %q at byte %d", tt.doc, err, tt.key, tt.offset)
			continue
		}
		if want := fmt.Sprintf("contains the key %q twice in one object, at byte %d", tt.key, tt.offset); !strings.HasPrefix(err.Error(), want) {
			t.Errorf("message %q, want it to start %q", err, want)
		}
	}
}

// smallPayloads are documents whose objects have few keys, as most
// payloads do.
var smallPayloads = map[string]string{
	"scalar":        `"text"`,
	"one key":       `{"user_id":42}`,
	"a few keys":    `{"to":"ada@example.com","subject":"Welcome","template":"welcome-v2","locale":"en"}`,
	"nested":        `{"order":{"id":"A-17","lines":[{"sku":"x","qty":2},{"sku":"y","qty":1}]},"notify":true}`,
	"escaped value": `{"path":"C:\\temp\\a.txt","emoji":"\ud83d\ude00"}`,
}

func TestCheckDuplicateKeys_AllocatesNothingForSmallObjects(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for name, doc := range smallPayloads {
		b := []byte(doc)
		if n := testing.AllocsPerRun(100, func() { _ = CheckDuplicateKeys(b) }); n != 0 {
			t.Errorf("CheckDuplicateKeys, %s: %v allocations", name, n)
		}
		// Check allocates for numbers; CheckAll adds nothing to that.
		checked := testing.AllocsPerRun(100, func() { _ = Check(b) })
		if n := testing.AllocsPerRun(100, func() { _ = CheckAll(b) }); n != checked {
			t.Errorf("CheckAll, %s: %v allocations, where Check makes %v", name, n, checked)
		}
	}
}

// FuzzCheckAll: CheckAll finds, in any valid JSON document, what Check
// finds, or, where Check finds nothing, what CheckDuplicateKeys finds,
// the same reason at the same place.
func FuzzCheckAll(f *testing.F) {
	for _, doc := range []string{
		`{}`, `"plain"`, `{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"a":{"b":1,"b":2},"a":3}`,
		`{"a":"\u0000"}`, `{"a":1,"a":"\u0000"}`, `{"a":"\u0000","a":1}`, `[{"x":1,"x":2}, 1e200000]`,
		`{"\ud800":1,"\ud800":2}`, `{"a":{},"a":[]}`, `[{"k":1},{"k":2}]`, `{"a":"{\"a\":1,\"a\":2}"}`,
		`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k\u0031":1}`,
		"{\"\xff\":1,\"\xff\":2}", `{"é":1,"\u00e9":2}`, `{"a" : 1, "a"	:2}`,
	} {
		f.Add([]byte(doc))
	}
	for _, doc := range smallPayloads {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			return
		}
		want := Check(doc)
		if want == nil {
			want = CheckDuplicateKeys(doc)
		}
		if got := CheckAll(doc); fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) {
			t.Errorf("CheckAll(%q) = %#v, want %#v", doc, got, want)
		}
	})
}

func BenchmarkCheckDuplicateKeys(b *testing.B) {
	docs := maps.Clone(smallPayloads)
	var sb strings.Builder
	sb.WriteString("{")
	for i := range 1000 {
		fmt.Fprintf(&sb, `"key%d":%d,`, i, i)
	}
	docs["1000 keys"] = strings.TrimSuffix(sb.String(), ",") + "}"
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		doc := []byte(docs[name])
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				if err := CheckDuplicateKeys(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCheckAll measures one walk that does what Check and
// CheckDuplicateKeys do, against the two walks of calling both.
func BenchmarkCheckAll(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("[")
	for i := range 1000 {
		fmt.Fprintf(&sb, `{"id":%d,"sku":"item-%d","qty":%d,"tags":["a","b"],"note":"C:\\temp"},`, i, i, i%7)
	}
	doc := []byte(strings.TrimSuffix(sb.String(), ",") + "]")
	b.Run("CheckAll", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		for b.Loop() {
			if err := CheckAll(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Check and CheckDuplicateKeys", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		for b.Loop() {
			if err := Check(doc); err != nil {
				b.Fatal(err)
			}
			if err := CheckDuplicateKeys(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestArrayLen_CountsAsEncodingJSONDoesAtAnyDepth: ArrayLen counts the
// elements encoding/json decodes from an array, and those of an array
// nested deeper than it reads; anything else holds none.
func TestArrayLen_CountsAsEncodingJSONDoesAtAnyDepth(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		`[]`, ` [ ] `, `[1]`, `[1, 2, 3]`, `[[1, 2], {"a": [3, 4], "b,": "]"}, "x,y", "\"]", []]`,
		`[{"attempt": 1, "error": "a, b"}, {"attempt": 2, "error": "[c]"}]`, "\n[\n1\n,\n2\n]\n",
	} {
		var elems []json.RawMessage
		if err := json.Unmarshal([]byte(doc), &elems); err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		if got := ArrayLen([]byte(doc)); got != len(elems) {
			t.Errorf("ArrayLen(%s) = %d, want %d", doc, got, len(elems))
		}
	}
	deep := strings.Repeat("[", MaxDecodeDepth+1) + strings.Repeat("]", MaxDecodeDepth+1)
	if got := ArrayLen([]byte("[" + deep + ", " + deep + ", 3]")); got != 3 {
		t.Errorf("ArrayLen of 3 arrays nested deeper than encoding/json reads = %d", got)
	}
	for _, doc := range []string{``, `null`, `{}`, `{"a": [1, 2]}`, `"[1, 2]"`, `7`} {
		if got := ArrayLen([]byte(doc)); got != 0 {
			t.Errorf("ArrayLen(%s) = %d, want 0", doc, got)
		}
	}
}

// FuzzAppendCompact: AppendCompact writes any valid JSON document in UTF-8,
// as PostgreSQL renders them all, as json.Marshal writes it as a
// json.RawMessage.
func FuzzAppendCompact(f *testing.F) {
	for _, doc := range []string{
		`null`, `[]`, `{}`, `[1, 2.50, -0.0, 1e3]`, `{"a": {"b": [true, false, null]}, "c": ""}`,
		`"<script>&amp;</script>"`, "\"\u2028\u2029 \u2027 \u202a\"", `"\"\\\/\b\f\n\r\t\u0001\u00e9\ud83d\ude00"`,
		" \t\r\n{ \"k\" :\t[ 1 ,\n2 ] } \n", `{"a": "x", "a": "y"}`, `"é € 😀"`, `["\\", "\\\"", "\"<\""]`,
	} {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) || !utf8.Valid(doc) {
			return
		}
		want, err := json.Marshal(json.RawMessage(doc))
		if err != nil {
			t.Fatalf("json.Marshal(%q): %v", doc, err)
		}
		if got := AppendCompact(nil, doc); string(got) != string(want) {
			t.Errorf("AppendCompact(%q) = %q, json.Marshal writes %q", doc, got, want)
		}
	})
}
