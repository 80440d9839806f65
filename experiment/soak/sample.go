package soak

import (
	"context"
	"fmt"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
)

// windowLag is how far behind the database clock a sample's job window
// ends: a claim or a completion is stamped with its transaction's start
// and becomes visible at its commit, so a window read up to the present
// would miss the transactions still committing, and never see them again.
const windowLag = time.Second

// pinApplicationName is the application_name of the sessions that pin the
// horizon (the idle transaction and the readers): they hold transactions
// open for a whole phase but write no job, so a window need not end
// before they began (SoakOldestOpenTransaction).
const pinApplicationName = harness.ApplicationName + " pin"

// Sample is one reading of the soak, every Config.Interval. Times are
// seconds since the run's start, by the database clock.
type Sample struct {
	// At is when the server's figures were read; the job figures cover the
	// window (WindowStart, WindowEnd], which ends windowLag earlier, or
	// earlier still while a transaction that began before then is open.
	At          float64 `json:"t_s"`
	WindowStart float64 `json:"window_start_s"`
	WindowEnd   float64 `json:"window_end_s"`
	// Phase is the phase At falls in.
	Phase string `json:"phase"`

	// The jobs of the window: enqueued, claimed, finished and succeeded,
	// per second, and the pickup latency of those claimed (ready to
	// claimed).
	EnqueuedPerSec  float64             `json:"enqueued_per_s"`
	ClaimedPerSec   float64             `json:"claimed_per_s"`
	FinishedPerSec  float64             `json:"finished_per_s"`
	SucceededPerSec float64             `json:"succeeded_per_s"`
	Pickup          harness.Percentiles `json:"pickup"`
	// Backlog is the jobs waiting at At.
	Backlog Backlog `json:"backlog"`

	// Tables is every user table of the database at At, and TableBytes,
	// IndexBytes, LiveTuples and DeadTuples their sums.
	Tables     []TableSample `json:"tables"`
	TableBytes int64         `json:"table_bytes"`
	IndexBytes int64         `json:"index_bytes"`
	LiveTuples int64         `json:"live_tuples"`
	DeadTuples int64         `json:"dead_tuples"`
	// Indexes is the size of every index, by name.
	Indexes map[string]int64 `json:"index_sizes"`
	// LargestIndex names the largest index at At.
	LargestIndex string `json:"largest_index"`

	// WALBytes is the WAL the server wrote since the run started, and
	// WALBytesPerSec its rate since the previous sample.
	WALBytes       int64   `json:"wal_bytes"`
	WALBytesPerSec float64 `json:"wal_bytes_per_s"`

	// The xmin horizon: the age, in transactions, of the oldest snapshot
	// (backend_xmin) and of the oldest transaction id (backend_xid) of the
	// database's other sessions, of the replication slots' and prepared
	// transactions', and HorizonAge, the greatest of them; and since when
	// the oldest transaction holding one has been open.
	XminAge             int64   `json:"xmin_age"`
	XidAge              int64   `json:"xid_age"`
	SlotXminAge         int64   `json:"slot_xmin_age,omitempty"`
	PreparedXidAge      int64   `json:"prepared_xid_age,omitempty"`
	HorizonAge          int64   `json:"horizon_age"`
	OldestTransactionMs float64 `json:"oldest_transaction_ms"`
	// AutovacuumWorkers is how many autovacuum workers were running on the
	// database at At.
	AutovacuumWorkers int64 `json:"autovacuum_workers"`

	// CPUBusy is the machine's busy share since the previous sample, and
	// StealS the CPU time the hypervisor took from it.
	CPUBusy float64 `json:"cpu_busy"`
	StealS  float64 `json:"steal_s,omitempty"`

	// pickups are the raw latencies, kept for the phases' percentiles.
	pickups []float64
	// at and windowMid place the sample on the database clock.
	at, windowMid time.Time
}

// TableSample is one table at one sample.
type TableSample struct {
	Name        string `json:"name"`
	TableBytes  int64  `json:"table_bytes"`
	IndexBytes  int64  `json:"index_bytes"`
	LiveTuples  int64  `json:"live_tuples"`
	DeadTuples  int64  `json:"dead_tuples"`
	Autovacuums int64  `json:"autovacuums"`
	Vacuums     int64  `json:"vacuums"`
}

// sampler reads the samples of one run.
type sampler struct {
	sys   System
	lab   *labdb.Queries
	start time.Time // the run's start, database clock

	since    time.Time
	walStart int64
	lastWAL  int64
	lastAt   time.Time
	lastCPU  harness.CPUSample
	cpuOK    bool
	// startAutovacuums is the autovacuum runs of every table at the start.
	startAutovacuums int64
}

// newSampler starts sampling at start, the run's start by the database
// clock.
func newSampler(ctx context.Context, sys System, lab *labdb.Queries, start time.Time) (*sampler, error) {
	srv, err := lab.SoakServer(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the server's counters: %w", err)
	}
	s := &sampler{sys: sys, lab: lab, start: start, since: start, walStart: srv.WalBytes, lastWAL: srv.WalBytes, lastAt: start}
	var first Sample
	if err := s.readTables(ctx, &first); err != nil {
		return nil, err
	}
	s.startAutovacuums = autovacuums(first)
	s.lastCPU, s.cpuOK = harness.ReadCPU()
	return s, nil
}

// sampleTimeout bounds the statements of one sample.
const sampleTimeout = 30 * time.Second

// take reads one sample.
func (s *sampler) take(ctx context.Context) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	now, err := s.lab.ExperimentClock(ctx)
	if err != nil {
		return Sample{}, fmt.Errorf("read the database clock: %w", err)
	}
	// The window ends a lag behind the clock, and before every
	// transaction still open began: one open longer than the lag (a slow
	// claim, or its commit) would commit rows stamped inside the window
	// after it was read.
	oldest, err := s.lab.SoakOldestOpenTransaction(ctx, pinApplicationName)
	if err != nil {
		return Sample{}, fmt.Errorf("read the oldest open transaction: %w", err)
	}
	until := now.Add(-windowLag)
	if open := oldest.Add(-time.Microsecond); open.Before(until) {
		until = open
	}
	sm := Sample{at: now, At: s.rel(now)}
	if until.After(s.since) {
		w, err := s.sys.Window(ctx, s.since, until)
		if err != nil {
			return Sample{}, err
		}
		secs := until.Sub(s.since).Seconds()
		sm.WindowStart, sm.WindowEnd = s.rel(s.since), s.rel(until)
		sm.windowMid = s.since.Add(until.Sub(s.since) / 2)
		sm.EnqueuedPerSec = harness.Round2(float64(w.Enqueued) / secs)
		sm.ClaimedPerSec = harness.Round2(float64(w.Claimed) / secs)
		sm.FinishedPerSec = harness.Round2(float64(w.Finished) / secs)
		sm.SucceededPerSec = harness.Round2(float64(w.Succeeded) / secs)
		sm.pickups = w.PickupMs
		sm.Pickup = harness.PercentilesOf(append([]float64(nil), w.PickupMs...))
		s.since = until
	}
	if sm.Backlog, err = s.sys.Backlog(ctx); err != nil {
		return Sample{}, err
	}
	if err := s.readTables(ctx, &sm); err != nil {
		return Sample{}, err
	}
	srv, err := s.lab.SoakServer(ctx)
	if err != nil {
		return Sample{}, fmt.Errorf("read the server's counters: %w", err)
	}
	sm.WALBytes = srv.WalBytes - s.walStart
	if d := now.Sub(s.lastAt).Seconds(); d > 0 {
		sm.WALBytesPerSec = harness.Round2(float64(srv.WalBytes-s.lastWAL) / d)
	}
	s.lastWAL, s.lastAt = srv.WalBytes, now
	sm.XminAge, sm.XidAge = srv.OldestXminAge, srv.OldestXidAge
	sm.SlotXminAge, sm.PreparedXidAge = srv.SlotXminAge, srv.PreparedXidAge
	sm.HorizonAge = max(sm.XminAge, sm.XidAge, sm.SlotXminAge, sm.PreparedXidAge)
	sm.OldestTransactionMs = harness.Round3(srv.OldestTransactionMs)
	sm.AutovacuumWorkers = srv.AutovacuumWorkers
	if cpu, ok := harness.ReadCPU(); ok && s.cpuOK {
		sm.CPUBusy = harness.Round3(s.lastCPU.Utilization(cpu))
		sm.StealS = harness.Round3((cpu.Steal - s.lastCPU.Steal).Seconds())
		s.lastCPU = cpu
	}
	return sm, nil
}

// readTables fills in the sizes and row counts of every user table and
// index.
func (s *sampler) readTables(ctx context.Context, sm *Sample) error {
	tables, err := s.lab.SoakTables(ctx)
	if err != nil {
		return fmt.Errorf("read the tables' statistics: %w", err)
	}
	for _, t := range tables {
		sm.Tables = append(sm.Tables, TableSample{
			Name: qualified(t.SchemaName, t.TableName), TableBytes: t.TableBytes, IndexBytes: t.IndexBytes,
			LiveTuples: t.LiveTuples, DeadTuples: t.DeadTuples, Autovacuums: t.Autovacuums, Vacuums: t.Vacuums,
		})
		sm.TableBytes += t.TableBytes
		sm.IndexBytes += t.IndexBytes
		sm.LiveTuples += t.LiveTuples
		sm.DeadTuples += t.DeadTuples
	}
	indexes, err := s.lab.SoakIndexes(ctx)
	if err != nil {
		return fmt.Errorf("read the indexes' sizes: %w", err)
	}
	sm.Indexes = make(map[string]int64, len(indexes))
	var largest int64 = -1
	for _, ix := range indexes {
		name := qualified(ix.SchemaName, ix.IndexName)
		sm.Indexes[name] = ix.IndexBytes
		if ix.IndexBytes > largest {
			largest, sm.LargestIndex = ix.IndexBytes, name
		}
	}
	return nil
}

// rel is t in seconds since the run's start.
func (s *sampler) rel(t time.Time) float64 { return harness.Round3(t.Sub(s.start).Seconds()) }

// qualified names a relation, leaving out the public schema.
func qualified(schema, name string) string {
	if schema == "public" {
		return name
	}
	return schema + "." + name
}
