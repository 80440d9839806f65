package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/jsonb"
)

// This file holds all JSON encoding and decoding of the API.

// errorBody is the body of every error response.
type errorBody struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// jsonAppender is a value of the API that writes its own JSON, as
// json.Marshal would, where json.Marshal cannot: JobView, whose stored
// documents may nest deeper than encoding/json writes.
type jsonAppender interface {
	AppendJSON(b []byte) ([]byte, error)
}

// writeJSON writes v as the JSON body of a response with the given status.
// The value is encoded before anything is written, so an encoding failure
// can still become a clean 500. No browser may read the body as another
// type than JSON, and no cache may store it: a job's state changes from
// one read to the next, and its payload may be confidential.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var b []byte
	var err error
	if a, ok := v.(jsonAppender); ok {
		b, err = a.AppendJSON(nil)
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(errorBody{Error: "internal server error"})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// AppendJSON appends v to b as json.Marshal writes it, whatever the depth
// of its documents. A document, as PostgreSQL stored it, may nest deeper
// than encoding/json writes (a result stored before the worker refused
// one, a row written by SQL): the summary's fields are marshaled, and
// each document is written on its own by appendDocument, not a level down
// in the view.
func (v JobView) AppendJSON(b []byte) ([]byte, error) {
	summary, err := json.Marshal(v.JobSummary)
	if err != nil {
		return nil, err
	}
	b = append(b, summary[:len(summary)-1]...) // all but its closing brace
	for _, f := range []struct {
		name string
		doc  json.RawMessage
	}{{"payload", v.Payload}, {"errors", v.Errors}} {
		b = append(append(append(b, `,"`...), f.name...), `":`...)
		if b, err = appendDocument(b, f.doc); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	b = strconv.AppendInt(append(b, `,"errors_omitted":`...), int64(v.ErrorsOmitted), 10)
	b = append(b, `,"result":`...)
	if b, err = appendDocument(b, v.Result); err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	return append(b, '}'), nil
}

// appendDocument appends doc, a JSON document that PostgreSQL rendered, as
// json.Marshal writes a json.RawMessage: compact, with <, >, &, U+2028 and
// U+2029 escaped, and null when empty. json.Marshal writes it where it
// can; one nested deeper than encoding/json reads (jsonb.MaxDecodeDepth),
// which jsonb holds, is written by jsonb.AppendCompact.
func appendDocument(b, doc []byte) ([]byte, error) {
	out, err := json.Marshal(json.RawMessage(doc))
	if err == nil {
		return append(b, out...), nil
	}
	if jsonb.Depth(doc) <= jsonb.MaxDecodeDepth {
		return nil, err
	}
	return jsonb.AppendCompact(b, doc), nil
}

// readBody reads a JSON request body of at most limit bytes and checks what
// can be checked before parsing: the Content-Encoding (none, or identity),
// each Content-Type (if set), the size, that it is not empty, and that it is
// valid UTF-8. The body is always parsed as JSON;
// application/x-www-form-urlencoded is accepted too because it is what a
// plain `curl -d '{...}'` sends, and curl is a first-class client.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	// A body is read as it is sent: a compressed one would be refused as
	// not UTF-8 or not JSON, or, with a plain body under a label such as
	// br, stored as if the label were not there.
	for _, v := range r.Header.Values("Content-Encoding") {
		for coding := range strings.SplitSeq(v, ",") {
			if coding = strings.TrimSpace(coding); coding != "" && !strings.EqualFold(coding, "identity") {
				return nil, &apiError{status: http.StatusUnsupportedMediaType, field: "Content-Encoding",
					msg: fmt.Sprintf("Content-Encoding %q is not supported: send the body uncompressed, without Content-Encoding", coding)}
			}
		}
	}
	// Every Content-Type given is checked, as a second one may be what a
	// client or a proxy meant, such as another charset. An empty one is
	// none.
	for _, ct := range r.Header.Values("Content-Type") {
		if ct == "" {
			continue
		}
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && mt != "application/x-www-form-urlencoded") ||
			(params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8")) {
			return nil, &apiError{status: http.StatusUnsupportedMediaType, msg: "Content-Type must be application/json", field: "Content-Type"}
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body is larger than %d bytes", limit)}
		}
		return nil, badRequest("", "could not read the request body")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest("", "request body is empty")
	}
	if !utf8.Valid(body) {
		return nil, badRequest("", "request body is not valid UTF-8")
	}
	return body, nil
}

// decodeStrict decodes data, which must be exactly one JSON object, into v.
// It rejects fields v does not have, keys that match a field only when case
// is ignored (which encoding/json would accept), keys given twice, and any
// data after the object. fields lists the JSON names v accepts.
func decodeStrict(data []byte, v any, fields []string) error {
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); len(trimmed) > 0 && trimmed[0] != '{' {
		return badRequest("", "request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("", "unexpected data after the JSON object")
	}
	return checkKeys(data, fields)
}

// checkKeys rejects keys of the JSON object in data (already known to be a
// valid object) that are not exactly in fields, or that appear twice.
func checkKeys(data []byte, fields []string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // {
		return decodeError(err)
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return decodeError(err)
		}
		key, _ := tok.(string)
		if !slices.Contains(fields, key) {
			return badRequest(key, "unknown field %q", key)
		}
		if seen[key] {
			return badRequest(key, "field %q is given more than once", key)
		}
		seen[key] = true
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return decodeError(err)
		}
		if wholeFields[key] {
			continue // read, whatever it holds, by wholeField
		}
		// encoding/json decodes an unpaired surrogate escape to U+FFFD
		// without a word: a name would be stored other than it was sent.
		// (A payload is checked whole, as jsonb, by the client's rules.)
		var je *jsonb.Error
		if len(value) > 0 && value[0] == '"' && errors.As(jsonb.Check(value), &je) && je.Reason == jsonb.ReasonSurrogate {
			return badRequest(key, "%s contains %s, which is not a character", key, jsonb.ReasonSurrogate)
		}
	}
	return nil
}

// fieldTypes describes, for type errors, what each field must be.
var fieldTypes = map[string]string{
	"kind":         "a string",
	"queue":        "a string",
	"run_at":       "an RFC 3339 timestamp string",
	"delay":        `a duration string such as "5s" or "1h30m"`,
	"priority":     "an integer from -32768 to 32767",
	"max_attempts": fmt.Sprintf("an integer from 1 to %d", client.MaxMaxAttempts),
	"jobs":         "an array of job objects",
}

// decodeError turns an encoding/json error into a 400 that names the field
// when it can.
func decodeError(err error) error {
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case strings.Contains(err.Error(), "exceeded max depth"):
		// encoding/json's bound, which its error calls a syntax error;
		// only a payload may nest, and client.Validate says how deep.
		return badRequest("", "request body nests arrays and objects more than %d deep, deeper than encoding/json reads: a payload may nest at most %d deep",
			jsonb.MaxDecodeDepth, client.MaxPayloadDepth)
	case errors.As(err, &syntaxErr):
		return badRequest("", "request body is not valid JSON: %s (at byte %d)", strings.TrimPrefix(syntaxErr.Error(), "json: "), syntaxErr.Offset)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("", "request body is not valid JSON: unexpected end of input")
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return badRequest("", "request body must be a JSON object")
		}
		want, ok := fieldTypes[typeErr.Field]
		if !ok {
			want = "of another type"
		}
		return badRequest(typeErr.Field, "%s must be %s", typeErr.Field, want)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		if unq, uerr := strconv.Unquote(name); uerr == nil {
			name = unq
		}
		return badRequest(name, "unknown field %q", name)
	}
	return badRequest("", "request body is not valid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
}
