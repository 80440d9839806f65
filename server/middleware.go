package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"path"
	"runtime/debug"
	"strings"
	"time"
)

// statusWriter records the status of a response for the middleware.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (sw *statusWriter) WriteHeader(code int) {
	if sw.status == 0 {
		sw.status = code
	}
	sw.ResponseWriter.WriteHeader(code)
}

func (sw *statusWriter) Write(p []byte) (int, error) {
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	return sw.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (sw *statusWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

// logRequests logs every request with its method, path, status and
// duration.
func logRequests(logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			sw := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(sw, r)
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			logger.LogAttrs(r.Context(), slog.LevelInfo, "http request",
				slog.String("method", r.Method),
				slog.String("path", r.URL.Path),
				slog.Int("status", status),
				slog.Duration("duration", time.Since(start)))
		})
	}
}

// recoverPanics turns a panic in a handler into a logged stack trace and a
// JSON 500, if the response has not started yet.
func recoverPanics(logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sw := &statusWriter{ResponseWriter: w}
			defer func() {
				v := recover()
				if v == nil {
					return
				}
				if v == http.ErrAbortHandler {
					panic(v)
				}
				logger.ErrorContext(r.Context(), "panic serving request",
					slog.String("method", r.Method),
					slog.String("path", r.URL.Path),
					slog.Any("panic", v),
					slog.String("stack", string(debug.Stack())))
				if sw.status == 0 {
					writeJSON(sw, http.StatusInternalServerError, errorBody{Error: "internal server error"})
				}
			}()
			next.ServeHTTP(sw, r)
		})
	}
}

// requireBearer returns middleware that lets a request through only with
// "Authorization: Bearer <token>", given once, and otherwise answers 401 with
// WWW-Authenticate. With an empty token it lets every request through.
func requireBearer(token string) func(http.Handler) http.Handler {
	if token == "" {
		return func(next http.Handler) http.Handler { return next }
	}
	// Comparing digests keeps the comparison constant-time in the length
	// of the token too.
	want := sha256.Sum256([]byte(token))
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// A request with two credentials is refused, whatever they
			// are: a proxy in front may have checked the other one.
			var header string
			if values := r.Header.Values("Authorization"); len(values) == 1 {
				header = values[0]
			}
			scheme, got, ok := strings.Cut(header, " ")
			gotSum := sha256.Sum256([]byte(strings.TrimSpace(got)))
			if !ok || !strings.EqualFold(scheme, "Bearer") ||
				subtle.ConstantTimeCompare(gotSum[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", "Bearer")
				writeJSON(w, http.StatusUnauthorized, errorBody{Error: "missing or invalid bearer token"})
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// refuseQuery returns middleware that answers 400 to a request with any
// query parameter (queryParams), for the routes that take none; hint, if
// not empty, is added to its message.
func refuseQuery(hint string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := queryParams(r, nil)
			if err == nil {
				next.ServeHTTP(w, r)
				return
			}
			msg := err.msg
			if hint != "" {
				msg += "; " + hint
			}
			writeJSON(w, err.status, errorBody{Error: msg, Field: err.field})
		})
	}
}

// jsonMuxErrors makes the 404 (no route) and 405 (no route for the method,
// with its Allow header) responses of mux JSON like every other response.
//
// Two more of its answers are made JSON here. The mux would answer a
// request for /v1/jobs/batch by any method but POST with GET /v1/jobs/{id}
// (a 400 for the id "batch") or with a 405 that allows GET: it is a 405
// that allows POST alone. And it redirects a path that is not in its
// canonical form, such as /v1//jobs, with an HTML body.
func jsonMuxErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == batchPath && r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: "method not allowed"})
			return
		}
		h, pattern := mux.Handler(r)
		if pattern != "" && (r.Method == http.MethodConnect || canonicalPath(r.URL.Path)) {
			mux.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(&muxErrorWriter{ResponseWriter: w}, r)
	})
}

// batchPath is the path of POST /v1/jobs/batch.
const batchPath = "/v1/jobs/batch"

// canonicalPath reports whether the mux serves p as it is, rather than
// redirecting to its cleaned form (as net/http's ServeMux cleans the path
// of every method but CONNECT).
func canonicalPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean == p
}

// muxErrorWriter replaces the plain-text body of the mux's own error
// responses with a JSON one, keeping their status and headers.
type muxErrorWriter struct {
	http.ResponseWriter
	wrote bool
}

func (m *muxErrorWriter) WriteHeader(code int) {
	if m.wrote {
		return
	}
	m.wrote = true
	msg := strings.ToLower(http.StatusText(code))
	switch code {
	case http.StatusNotFound:
		msg = "no such route"
	case http.StatusMethodNotAllowed:
		msg = "method not allowed"
	}
	writeJSON(m.ResponseWriter, code, errorBody{Error: msg})
}

func (m *muxErrorWriter) Write(p []byte) (int, error) {
	if !m.wrote {
		m.WriteHeader(http.StatusNotFound)
	}
	return len(p), nil
}
