package faultproxy

import (
	"bytes"
	"encoding/binary"
	"strings"
	"sync/atomic"
)

// The protocol codes of the untyped requests a client may send before its
// startup message.
const (
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
	codeCancelRequest = 80877102
)

// maxStartupLength bounds a startup message; anything longer is not
// PostgreSQL's protocol, and the connection is left unparsed.
const maxStartupLength = 10000

// frontendParser follows the messages a client sends, to tell when it
// executes a statement of interest. It only ever reads the stream.
type frontendParser struct {
	// match is the text that marks a statement of interest ("" for none);
	// nonEmptyFirstArray further requires a non-empty first parameter.
	match              string
	nonEmptyFirstArray bool

	// hit is set when a statement of interest was executed; the caller
	// clears it.
	hit bool
	// sslRequested is set when the client asked for TLS or GSS encryption,
	// to which the server answers with a single byte; the caller clears it.
	sslRequested bool

	started bool // past the startup message: every message is typed now
	opaque  bool // not a protocol this parser follows: stop reading
	buf     []byte
	skip    int               // bytes of an uninteresting message still to skip
	stmts   map[string]string // prepared statement name -> text
}

func (f *frontendParser) feed(b []byte) {
	if f.opaque {
		return
	}
	if f.skip > 0 {
		k := min(f.skip, len(b))
		f.skip -= k
		b = b[k:]
	}
	f.buf = append(f.buf, b...)
	for len(f.buf) > 0 && !f.opaque {
		if !f.started {
			if len(f.buf) < 8 {
				return
			}
			n := int(binary.BigEndian.Uint32(f.buf[0:4]))
			if n < 8 || n > maxStartupLength {
				f.giveUp()
				return
			}
			if len(f.buf) < n {
				return
			}
			switch binary.BigEndian.Uint32(f.buf[4:8]) {
			case codeSSLRequest, codeGSSENCRequest:
				f.sslRequested = true // the startup message follows the answer
			case codeCancelRequest:
			default:
				f.started = true
			}
			f.buf = f.buf[n:]
			continue
		}
		if len(f.buf) < 5 {
			return
		}
		typ := f.buf[0]
		n := int(binary.BigEndian.Uint32(f.buf[1:5]))
		if n < 4 {
			f.giveUp()
			return
		}
		if len(f.buf) < 1+n {
			if typ != 'P' && typ != 'B' && typ != 'Q' {
				// Not of interest (COPY data, say): skip it unbuffered.
				f.skip = 1 + n - len(f.buf)
				f.buf = f.buf[:0]
			}
			return
		}
		f.handle(typ, f.buf[5:1+n])
		f.buf = f.buf[1+n:]
	}
	if len(f.buf) == 0 {
		f.buf = nil // let a large buffer go
	}
}

func (f *frontendParser) giveUp() {
	f.opaque = true
	f.buf = nil
	f.stmts = nil
}

// handle reads one typed message (body without type and length).
func (f *frontendParser) handle(typ byte, body []byte) {
	switch typ {
	case 'P': // Parse: name, query, parameter types
		name, rest, ok := cstring(body)
		if !ok {
			return
		}
		query, _, ok := cstring(rest)
		if !ok {
			return
		}
		if f.stmts == nil {
			f.stmts = map[string]string{}
		}
		f.stmts[name] = query
	case 'B': // Bind: portal, statement, formats, parameters
		_, rest, ok := cstring(body)
		if !ok {
			return
		}
		stmt, rest, ok := cstring(rest)
		if !ok || f.match == "" || !strings.Contains(f.stmts[stmt], f.match) {
			return
		}
		if f.nonEmptyFirstArray && !firstParamNonEmptyArray(rest) {
			return
		}
		f.hit = true
	case 'Q': // simple Query: no parameters to look at
		query, _, ok := cstring(body)
		if ok && f.match != "" && !f.nonEmptyFirstArray && strings.Contains(query, f.match) {
			f.hit = true
		}
	}
}

// firstParamNonEmptyArray reads the format codes and parameters of a Bind
// message and reports whether the first parameter is an array with at
// least one element, in text ('{...}') or binary format.
func firstParamNonEmptyArray(b []byte) bool {
	if len(b) < 2 {
		return false
	}
	nfmt := int(binary.BigEndian.Uint16(b[0:2]))
	b = b[2:]
	if len(b) < 2*nfmt+2 {
		return false
	}
	format := uint16(0)
	if nfmt >= 1 {
		format = binary.BigEndian.Uint16(b[0:2])
	}
	b = b[2*nfmt:]
	nparams := int(binary.BigEndian.Uint16(b[0:2]))
	b = b[2:]
	if nparams < 1 || len(b) < 4 {
		return false
	}
	size := int32(binary.BigEndian.Uint32(b[0:4]))
	b = b[4:]
	if size < 0 || int(size) > len(b) {
		return false // NULL, or cut short
	}
	v := b[:size]
	if format == 1 {
		// ndim, has-nulls flag, element type, then (length, lower bound)
		// per dimension: pgx sends an empty slice as one dimension of
		// length 0.
		if len(v) < 12 {
			return false
		}
		ndim := int(binary.BigEndian.Uint32(v[0:4]))
		if ndim == 0 || len(v) < 12+8*ndim {
			return false
		}
		for d := range ndim {
			if binary.BigEndian.Uint32(v[12+8*d:]) == 0 {
				return false
			}
		}
		return true
	}
	v = bytes.TrimSpace(v)
	return len(v) > 2 && v[0] == '{' && !bytes.Equal(v, []byte("{}"))
}

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte, bool) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return "", nil, false
	}
	return string(b[:i]), b[i+1:], true
}

// backendParser follows the message boundaries of what a server sends, to
// find the end of an answer: its ReadyForQuery message. It keeps no
// message bodies.
type backendParser struct {
	// expectSSLReply is set (by the client's pump) when the server is
	// about to answer an encryption request with a single untyped byte.
	expectSSLReply atomic.Bool

	opaque    bool
	hdr       [5]byte
	hdrLen    int
	remaining int
	typ       byte
	sawError  bool // an ErrorResponse since the last ReadyForQuery
}

// feed reads chunk, calling onReady, if not nil, with the offset just past
// each ReadyForQuery message in chunk and whether an ErrorResponse came
// since the previous one (the statement failed, so nothing committed).
func (p *backendParser) feed(chunk []byte, onReady func(end int, failed bool)) {
	for i := 0; i < len(chunk) && !p.opaque; {
		if p.hdrLen == 0 && p.remaining == 0 && p.expectSSLReply.Load() {
			p.expectSSLReply.Store(false)
			if chunk[i] != 'N' {
				p.opaque = true // encrypted from here on
				return
			}
			i++
			continue
		}
		if p.remaining > 0 {
			k := min(p.remaining, len(chunk)-i)
			i += k
			p.remaining -= k
			if p.remaining == 0 {
				p.end(i, onReady)
			}
			continue
		}
		k := min(5-p.hdrLen, len(chunk)-i)
		copy(p.hdr[p.hdrLen:], chunk[i:i+k])
		p.hdrLen += k
		i += k
		if p.hdrLen < 5 {
			return
		}
		p.hdrLen = 0
		p.typ = p.hdr[0]
		n := int(binary.BigEndian.Uint32(p.hdr[1:5]))
		if n < 4 {
			p.opaque = true
			return
		}
		p.remaining = n - 4
		if p.remaining == 0 {
			p.end(i, onReady)
		}
	}
}

func (p *backendParser) end(offset int, onReady func(int, bool)) {
	switch p.typ {
	case 'E':
		p.sawError = true
	case 'Z':
		failed := p.sawError
		p.sawError = false
		if onReady != nil {
			onReady(offset, failed)
		}
	}
}
