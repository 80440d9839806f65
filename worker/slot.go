package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/jsonb"
)

// slot runs claimed jobs one after another, in a goroutine of its own; a
// worker runs at most Config.Slots of them at once.
type slot struct {
	w *Worker
}

type outcome struct {
	exec   *execution
	result json.RawMessage
	err    error
	// ran is how long the handler took; negative when it never ran.
	ran time.Duration
}

// run is one slot: it runs the first job waiting for a slot, then the
// next, as long as jobs are waiting, so that a job claimed ahead starts the
// moment the one before it returns. It hands each outcome to the
// dispatcher.
func (s slot) run() {
	s.runFrom(s.w.nextForSlot(nil))
}

// runFrom runs e, then every job waiting for the slot after it.
func (s slot) runFrom(e *execution) {
	for e != nil {
		o := s.execute(e)
		e = s.handOver(o)
	}
}

// handOver marks o's job returned, takes the next job waiting for the
// slot, and gives o to the dispatcher. The channel holds an outcome for
// every job held, so this never blocks.
func (s slot) handOver(o outcome) *execution {
	next := s.w.nextForSlot(o.exec)
	s.w.outcomes <- o
	return next
}

// execute runs one job's handler, unless its lease was lost or someone
// cancelled it while it waited for a slot, and returns its outcome.
func (s slot) execute(e *execution) outcome {
	if e.ctx.Err() != nil {
		return outcome{exec: e, err: context.Cause(e.ctx), ran: -1}
	}
	began := time.Now()
	result, err := s.call(e, began)
	return outcome{exec: e, result: result, err: err, ran: time.Since(began)}
}

// encodeResult encodes a handler's result for the database. A result that
// cannot be stored fails its job permanently, here, before it is sent: in
// a batch acknowledgement it would make the database refuse the others. So
// does one that jsonb would store only in part, with a key given twice in
// one object.
func (s slot) encodeResult(result any) (json.RawMessage, error) {
	b, err := json.Marshal(result)
	if err != nil {
		return nil, Permanent(fmt.Errorf("encode result: %w", err))
	}
	if limit := s.w.cfg.MaxResultBytes; limit > 0 && len(b) > limit {
		return nil, Permanent(fmt.Errorf("result is %d bytes encoded, more than the %d allowed (Config.MaxResultBytes)", len(b), limit))
	}
	if len(b) > maxStatementResults {
		return nil, Permanent(fmt.Errorf("result is %d bytes encoded, more than the %d one statement can carry", len(b), maxStatementResults))
	}
	// A result may nest as deep as a payload: the job's view holds it a
	// level down, and encoding/json reads no deeper than 10,000.
	if d := jsonb.Depth(b); d > client.MaxPayloadDepth {
		return nil, Permanent(fmt.Errorf("result nests arrays and objects %d deep, more than the %d allowed (client.MaxPayloadDepth)", d, client.MaxPayloadDepth))
	}
	// One walk finds what jsonb refuses, and a key given twice in one
	// object, of which jsonb would keep the last value and drop the
	// others, as the client refuses for a payload: json.Marshal writes a
	// json.RawMessage, a MarshalJSON's output or map keys whose texts
	// coincide as they come.
	var je *jsonb.Error
	switch err := jsonb.CheckAll(b); {
	case errors.As(err, &je) && je.Reason == jsonb.ReasonDuplicateKey:
		return nil, Permanent(fmt.Errorf("result %w", err))
	case err != nil:
		return nil, Permanent(fmt.Errorf("%s: %w", errResultNotStorable, err))
	}
	return b, nil
}

// maxStatementResults is how many bytes of encoded results one statement
// carries at most: pgx sends no message of 1 GiB or more, and PostgreSQL
// reads none, so a larger result could never be stored, and each attempt
// to send it would fail its whole round until the job's lease ran out. The
// rest of the statement, ids, lease tokens and the claim, fits in what is
// left. Tests lower it.
var maxStatementResults = 1<<30 - 16<<20

// errResultNotStorable begins the error of a job whose result PostgreSQL's
// jsonb cannot hold.
const errResultNotStorable = "result is not storable as jsonb"

// call runs the handler, begun at began, and encodes its result (see
// encodeResult), turning a panic or a missing handler into an error. The
// result's own MarshalJSON or MarshalText is the handler's code too, and
// json.Marshal passes its panics on: one fails the job permanently, since
// the same result would panic again. A handler, or a marshaler, that ends
// its goroutine with runtime.Goexit (as testing.T.FailNow does) rather
// than returning cannot be stopped from ending it (see protect): its
// attempt fails with errHandlerExited, and a new goroutine hands that
// outcome over and carries on the slot's work.
func (s slot) call(e *execution, began time.Time) (result json.RawMessage, err error) {
	h, ok := s.w.handler(e.job.Kind)
	if !ok {
		return nil, Permanent(fmt.Errorf("no handler registered for kind %q", e.job.Kind))
	}
	protected := false
	defer func() {
		if !protected {
			o := outcome{exec: e, err: errHandlerExited, ran: time.Since(began)}
			go func() { s.runFrom(s.handOver(o)) }()
		}
	}()
	encoding := false
	p := protect(func() {
		job := e.job
		v, herr := h.Work(e.ctx, &job)
		if herr != nil {
			err = checkedError(herr)
		}
		if err == nil && v != nil {
			encoding = true
			result, err = s.encodeResult(v)
		}
	})
	protected = true
	switch {
	case p != nil && encoding:
		return nil, Permanent(fmt.Errorf("encode result: result marshaler panicked: %v\n%s", p.value, p.stack))
	case p != nil:
		return nil, fmt.Errorf("handler panicked: %v\n%s", p.value, p.stack)
	}
	return result, err
}

// caught is a panic that protect recovered: its value, nil for a
// panic(nil) under GODEBUG panicnil=1, and the stack that raised it.
type caught struct {
	value any
	stack []byte
}

// protect calls f, code of the application's, and returns the panic f
// raised, recovered, or nil if f returned. recover returns nil for a
// panic(nil) under GODEBUG panicnil=1, and stops it all the same: such a
// panic is told from a return by f's not having returned. An f that ends
// its goroutine with runtime.Goexit, which nothing can stop, ends
// protect's too: protect does not return, and its caller's deferred
// functions run, which tell that case from the others by protect's not
// having returned.
func protect(f func()) (p *caught) {
	returned := false
	defer func() {
		if !returned {
			p = &caught{value: recover(), stack: debug.Stack()}
		}
	}()
	f()
	returned = true
	return nil
}

// checkedError returns a handler's error err, or, if asking it its message
// or whether it is permanent panics (as a nil pointer returned as an error
// may), an error that says so: the worker asks both of every failure it
// records, away from the handler's goroutine and its recover.
func checkedError(err error) (checked error) {
	defer func() {
		if r := recover(); r != nil {
			checked = fmt.Errorf("handler returned an error of type %T whose methods panicked when asked its message: %v", err, r)
		}
	}()
	_ = err.Error()
	IsPermanent(err)
	return err
}

// errHandlerExited is the error of an attempt whose handler ended its
// goroutine with runtime.Goexit instead of returning.
var errHandlerExited = errors.New("handler exited its goroutine (runtime.Goexit) without returning")
