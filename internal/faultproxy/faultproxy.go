// Package faultproxy is a TCP proxy that injects network faults between a
// PostgreSQL client and its server, for tests and the chaos experiments:
//
//   - Cut closes every connection at once and refuses new ones until Heal:
//     both ends see the connection drop, as when a process or a host dies
//     or a firewall resets the connection.
//   - Blackhole keeps every connection open but stops forwarding, in both
//     directions, until Heal: a silent partition, in which neither end
//     learns anything until TCP gives up. Bytes sent meanwhile are held and
//     delivered at Heal, late, as a network that recovers would.
//   - CutAfterCommit closes a connection just after the server committed a
//     statement of interest and before the client reads the answer: the
//     client cannot know whether its statement took effect. It may close
//     the client's end alone (CommitCut.KeepServer), so that the server,
//     which sees nothing, keeps the session open until Cut or Close.
//   - Slow holds what clients send for a while before forwarding it: a
//     server that answers late, as an overloaded one or one far away does,
//     while every connection stays open.
//
// The proxy listens on 127.0.0.1 on a port of its own; point a client at
// Addr instead of the server. Only CutAfterCommit reads the traffic: it
// follows PostgreSQL's wire protocol (version 3) without TLS, so the client
// must connect with sslmode=disable (or prefer, which the proxy leaves
// unparsed and so never cuts).
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayq/relay/internal/pgurl"
)

// dialTimeout bounds the connection to the server for each client.
const dialTimeout = 5 * time.Second

// Proxy forwards TCP connections to one server and injects faults into
// them. Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener

	mu         sync.Mutex
	state      state
	resume     chan struct{} // closed by Heal after a Blackhole
	links      map[*link]struct{}
	nextLinkID int
	commitCut  *CommitCut
	closed     bool
	delay      time.Duration // set by Slow
	// orphans are the server ends of connections CutAfterCommit closed on
	// the client's side alone (CommitCut.KeepServer), kept open until Cut
	// or Close.
	orphans []net.Conn

	wg sync.WaitGroup

	accepted   atomic.Int64
	refused    atomic.Int64
	cuts       atomic.Int64
	commitCuts atomic.Int64
}

type state int

const (
	stateOpen state = iota
	stateCut
	stateBlackhole
)

// Stats counts what a proxy has done so far.
type Stats struct {
	// Accepted is how many client connections were forwarded.
	Accepted int64
	// Refused is how many were closed at once, during a Cut.
	Refused int64
	// Cut is how many connections Cut closed.
	Cut int64
	// CommitCuts is how many connections CutAfterCommit closed.
	CommitCuts int64
	// Open is how many connections are open now.
	Open int
}

// Start starts a proxy to target (host:port) on a free port of 127.0.0.1.
// Close stops it.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}, resume: make(chan struct{})}
	close(p.resume)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// StartFor starts a proxy to the server of the PostgreSQL URL url, as
// Start does, and returns it with url changed to reach the server through
// it.
func StartFor(url string) (*Proxy, string, error) {
	target, err := pgurl.HostPort(url)
	if err != nil {
		return nil, "", fmt.Errorf("faultproxy: %w", err)
	}
	p, err := Start(target)
	if err != nil {
		return nil, "", err
	}
	through, err := pgurl.WithHostPort(url, p.Addr())
	if err != nil {
		p.Close()
		return nil, "", fmt.Errorf("faultproxy: %w", err)
	}
	return p, through, nil
}

// Addr returns the address clients connect to, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.links)
	p.mu.Unlock()
	return Stats{
		Accepted:   p.accepted.Load(),
		Refused:    p.refused.Load(),
		Cut:        p.cuts.Load(),
		CommitCuts: p.commitCuts.Load(),
		Open:       open,
	}
}

// Cut closes every connection now and refuses new ones (accepting and
// closing them at once) until Heal. It returns how many it closed.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	if p.state == stateBlackhole {
		close(p.resume) // wake the held pumps: their links are closed below
	}
	p.state = stateCut
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	orphans := p.orphans
	p.orphans = nil
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
	for _, c := range orphans {
		c.Close()
	}
	p.cuts.Add(int64(len(links)))
	return len(links)
}

// Blackhole stops forwarding on every connection, old and new, until Heal,
// without closing any.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == stateBlackhole {
		return
	}
	p.state = stateBlackhole
	p.resume = make(chan struct{})
}

// Heal ends a Cut or a Blackhole: new connections are forwarded again, and
// after a Blackhole the bytes held meanwhile are delivered.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == stateBlackhole {
		close(p.resume)
	}
	p.state = stateOpen
}

// Slow holds every read from a client, on every connection, old and new,
// for d before forwarding it to the server, until Slow(0). A client that
// sends one message or statement at a time gets each answer d late; one
// that sends several before reading waits d more for each read the proxy
// made of them. Slow(0) ends it; Heal does not.
func (p *Proxy) Slow(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = max(d, 0)
}

// holdFor returns how long Slow asks that a read be held.
func (p *Proxy) holdFor() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.state == stateBlackhole {
		close(p.resume)
	}
	p.state = stateCut
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	orphans := p.orphans
	p.orphans = nil
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close()
	}
	for _, c := range orphans {
		c.Close()
	}
	p.wg.Wait()
	return err
}

// CommitCut describes connections to cut just after a commit: see
// CutAfterCommit.
type CommitCut struct {
	// Statement is matched against the text of every statement a client
	// prepares or sends: a statement containing it is of interest. sqlc
	// puts each query's name in its text ("-- name: JobCompleteAndClaim"),
	// so a query's name is enough.
	Statement string
	// NonEmptyFirstArray, if set, limits the cut to executions whose first
	// parameter is a non-empty array (the ids a JobCompleteAndClaim
	// completes): executions with nothing to commit are left alone.
	NonEmptyFirstArray bool
	// KeepServer, if set, closes the client's end of the connection
	// alone: the server's stays open, and silent, until Cut or Close, as
	// when the client's host vanished without the server noticing. The
	// server's session, and the locks it holds, live on meanwhile.
	KeepServer bool
	// Times is how many connections to cut; the proxy disarms itself
	// after the last one.
	Times int
	// OnCut, if set, is called (in a goroutine of its own) after each cut.
	OnCut func(CutEvent)
}

// CutEvent describes one connection cut after a commit.
type CutEvent struct {
	// At is when the proxy had the server's whole answer, which it then
	// dropped.
	At time.Time
	// Conn numbers the connection, from 1, in the order they were accepted.
	Conn int
	// Statement is CommitCut.Statement.
	Statement string
	// DroppedBytes is how many bytes of the server's answer the client
	// never got.
	DroppedBytes int
}

// CutAfterCommit arms the proxy to cut connections as statements of
// interest commit. For each execution of such a statement, the proxy holds
// the server's answer until the server's ReadyForQuery message, which
// PostgreSQL sends only after the statement's implicit transaction has
// committed; then, while armed, it drops that answer and closes both ends
// of the connection. The client sees its connection fail with the
// statement sent and no answer, although the statement took effect.
// Arming again replaces the previous arming.
func (p *Proxy) CutAfterCommit(c CommitCut) {
	if c.Times <= 0 {
		c.Times = 1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.commitCut = &c
}

// Disarm cancels CutAfterCommit.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.commitCut = nil
}

// Armed reports how many commit cuts are still to come.
func (p *Proxy) Armed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.commitCut == nil {
		return 0
	}
	return p.commitCut.Times
}

// armedStatement returns the statement text of interest ("" when the proxy
// is not armed) and whether only executions with a non-empty first array
// parameter are of interest (CommitCut.NonEmptyFirstArray).
func (p *Proxy) armedStatement() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.commitCut == nil {
		return "", false
	}
	return p.commitCut.Statement, p.commitCut.NonEmptyFirstArray
}

// takeCommitCut consumes one armed cut, if any is left.
func (p *Proxy) takeCommitCut() (*CommitCut, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.commitCut == nil || p.commitCut.Times <= 0 {
		return nil, false
	}
	c := *p.commitCut
	p.commitCut.Times--
	if p.commitCut.Times == 0 {
		p.commitCut = nil
	}
	return &c, true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		if p.closed || p.state == stateCut {
			p.mu.Unlock()
			p.refused.Add(1)
			c.Close()
			continue
		}
		p.nextLinkID++
		l := &link{p: p, id: p.nextLinkID, client: c, done: make(chan struct{})}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		p.accepted.Add(1)
		go l.run()
	}
}

// gate blocks while the proxy is blackholed. It returns false if the link
// was closed meanwhile, or the proxy cut it.
func (p *Proxy) gate(l *link) bool {
	for {
		p.mu.Lock()
		st, resume := p.state, p.resume
		p.mu.Unlock()
		if st != stateBlackhole {
			return !l.isClosed()
		}
		select {
		case <-resume:
		case <-l.done:
			return false
		}
	}
}

func (p *Proxy) remove(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// link is one proxied connection.
type link struct {
	p      *Proxy
	id     int
	client net.Conn

	mu       sync.Mutex
	server   net.Conn
	closed   bool
	done     chan struct{}
	awaiting bool // a statement of interest was sent; hold its answer
}

func (l *link) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

func (l *link) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.done)
	server := l.server
	l.mu.Unlock()
	l.client.Close()
	if server != nil {
		server.Close()
	}
}

// orphan detaches the server's end of l, so that closing l leaves it
// open, and hands it to the proxy, which closes it at Cut or Close.
func (l *link) orphan() {
	l.mu.Lock()
	server := l.server
	l.server = nil
	l.mu.Unlock()
	if server == nil {
		return
	}
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if l.p.closed {
		server.Close()
		return
	}
	l.p.orphans = append(l.p.orphans, server)
}

func (l *link) setAwaiting(v bool) {
	l.mu.Lock()
	l.awaiting = v
	l.mu.Unlock()
}

func (l *link) isAwaiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.awaiting
}

func (l *link) run() {
	defer l.p.wg.Done()
	defer l.p.remove(l)
	defer l.close()
	if !l.p.gate(l) {
		return
	}
	server, err := net.DialTimeout("tcp", l.p.target, dialTimeout)
	if err != nil {
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		server.Close()
		return
	}
	l.server = server
	l.mu.Unlock()

	fe := &frontendParser{}
	be := &backendParser{}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer l.close()
		l.pumpClient(server, fe, be)
	}()
	go func() {
		defer wg.Done()
		defer l.close()
		l.pumpServer(server, be)
	}()
	wg.Wait()
}

// pumpClient forwards the client's bytes to the server, looking for the
// statements of interest.
func (l *link) pumpClient(server net.Conn, fe *frontendParser, be *backendParser) {
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			if d := l.p.holdFor(); d > 0 {
				select {
				case <-time.After(d):
				case <-l.done:
					return
				}
			}
			// Parse before forwarding, so that the link awaits the answer
			// before the server can send it.
			fe.match, fe.nonEmptyFirstArray = l.p.armedStatement()
			fe.feed(buf[:n])
			if fe.sslRequested {
				be.expectSSLReply.Store(true)
				fe.sslRequested = false
			}
			if fe.hit {
				fe.hit = false
				l.setAwaiting(true)
			}
			if !l.p.gate(l) {
				return
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// Deliver the end of the stream too, once the network is
				// back: the server then ends the session.
				l.p.gate(l)
			}
			return
		}
	}
}

// pumpServer forwards the server's bytes to the client, holding the answer
// to a statement of interest until its ReadyForQuery, then cutting the
// connection or releasing the answer.
func (l *link) pumpServer(server net.Conn, be *backendParser) {
	buf := make([]byte, 32<<10)
	var held []byte
	for {
		n, err := server.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if !l.isAwaiting() && len(held) == 0 {
				be.feed(chunk, nil)
				if !l.p.gate(l) {
					return
				}
				if _, werr := l.client.Write(chunk); werr != nil {
					return
				}
			} else {
				// Find the end of the answer: the first ReadyForQuery.
				split, failed := -1, false
				be.feed(chunk, func(end int, f bool) {
					if split < 0 {
						split, failed = end, f
					}
				})
				if split < 0 {
					held = append(held, chunk...)
				} else {
					held = append(held, chunk[:split]...)
					rest := chunk[split:]
					l.setAwaiting(false)
					if failed {
						// The statement failed: nothing committed, so
						// there is nothing to be unsure about.
					} else if c, ok := l.p.takeCommitCut(); ok {
						l.p.commitCuts.Add(1)
						ev := CutEvent{At: time.Now(), Conn: l.id, Statement: c.Statement, DroppedBytes: len(held)}
						if c.KeepServer {
							l.orphan()
						}
						l.close()
						if c.OnCut != nil {
							go c.OnCut(ev)
						}
						return
					}
					out := append(held, rest...)
					held = nil
					if !l.p.gate(l) {
						return
					}
					if _, werr := l.client.Write(out); werr != nil {
						return
					}
				}
			}
		}
		if err != nil {
			return
		}
	}
}
