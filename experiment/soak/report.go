package soak

import (
	"fmt"
	"io"
	"time"

	"github.com/relayq/relay/experiment/harness"
)

// settleFactor is how far above the clean phase's pickup p95 a window may
// be and count as back to normal: the target of issue 12 is within twice.
const settleFactor = 2

// Phase is the summary of one phase. Its job figures cover the sampling
// windows whose middle falls in the phase; its server figures, the samples
// read in it.
type Phase struct {
	Kind string `json:"kind"`
	// StartS and EndS place the phase on the run's clock, in seconds.
	StartS float64 `json:"start_s"`
	EndS   float64 `json:"end_s"`
	// RatePerSec is the load offered, as configured.
	RatePerSec float64 `json:"rate_per_s"`
	Samples    int     `json:"samples"`
	// EnqueuedPerSec, SucceededPerSec and FinishedPerSec are the measured
	// rates; KeptUp is SucceededPerSec / EnqueuedPerSec.
	EnqueuedPerSec  float64 `json:"enqueued_per_s"`
	SucceededPerSec float64 `json:"succeeded_per_s"`
	FinishedPerSec  float64 `json:"finished_per_s"`
	KeptUp          float64 `json:"kept_up"`
	// Pickup is the pickup latency (ready to claimed) of every job claimed
	// in the phase, and PickupP95VsClean its p95 over the clean phase's.
	Pickup           harness.Percentiles `json:"pickup"`
	PickupP95VsClean float64             `json:"pickup_p95_vs_clean,omitempty"`
	// SettledAfterS is how long after the phase began its windows' pickup
	// p95 came back within twice the clean phase's and stayed there until
	// the phase ended; absent if it never did (or for the clean phase).
	SettledAfterS *float64 `json:"settled_after_s,omitempty"`
	// The backlog of ready jobs: its largest, at the last sample, and the
	// longest a ready job had waited at a sample.
	BacklogMax       int64   `json:"backlog_max"`
	BacklogEnd       int64   `json:"backlog_end"`
	OldestReadyMsMax float64 `json:"oldest_ready_ms_max"`
	// Sizes of every table and of every index, summed, at the phase's
	// first and last samples, and each table at the last.
	TableBytesStart int64         `json:"table_bytes_start"`
	TableBytesEnd   int64         `json:"table_bytes_end"`
	IndexBytesStart int64         `json:"index_bytes_start"`
	IndexBytesEnd   int64         `json:"index_bytes_end"`
	Tables          []TableSample `json:"tables_end"`
	// Dead row versions of every table, summed: the most at a sample, and
	// at the last.
	DeadTuplesMax int64 `json:"dead_tuples_max"`
	DeadTuplesEnd int64 `json:"dead_tuples_end"`
	// Autovacuums is how many times autovacuum processed a table during the
	// phase.
	Autovacuums int64 `json:"autovacuums"`
	// WAL written during the phase (the whole server's), per second and per
	// job that succeeded.
	WALBytes       int64   `json:"wal_bytes"`
	WALBytesPerSec float64 `json:"wal_bytes_per_s"`
	WALBytesPerJob float64 `json:"wal_bytes_per_job"`
	// The xmin horizon's greatest age, in transactions, and the longest a
	// transaction holding it had been open, at a sample.
	HorizonAgeMax          int64   `json:"horizon_age_max"`
	OldestTransactionMsMax float64 `json:"oldest_transaction_ms_max"`
	// The machine's mean busy share, and the CPU time stolen from it.
	CPUBusy float64 `json:"cpu_busy"`
	StealS  float64 `json:"steal_s,omitempty"`
	// What pinned the horizon: the idle transaction's id, or the readers.
	IdleXID int64        `json:"idle_xid,omitempty"`
	Readers *ReaderStats `json:"readers,omitempty"`
	// EnqueueOwedMax is the most jobs the producer owed at once: more than
	// a tick's worth (the rate × 10 ms) means it fell behind.
	EnqueueOwedMax int `json:"enqueue_owed_max"`
}

// phaseOf returns the index of the phase that t falls in: the first
// before the first phase, the last after the last.
func (r *Result) phaseOf(t time.Time) int {
	for i, p := range r.phaseAt {
		if t.Before(p.end) {
			return i
		}
	}
	return len(r.phaseAt) - 1
}

// within reports whether t falls in phase i itself: from its start to its
// end, not in the gap before it, while the soak readied what pins the
// horizon (the readers' table apart is filled there), which phaseOf gives
// to the phase.
func (r *Result) within(t time.Time, i int) bool {
	span := r.phaseAt[i]
	return !t.Before(span.start) && t.Before(span.end)
}

// summarise labels every sample with its phase and fills in each phase's
// summary.
func (r *Result) summarise() {
	if len(r.phaseAt) == 0 {
		return
	}
	for i := range r.Samples {
		r.Samples[i].Phase = string(r.phaseAt[r.phaseOf(r.Samples[i].at)].kind)
	}
	cleanP95 := 0.0
	for i := range r.Phases {
		r.summarisePhase(i)
		if r.Phases[i].Kind == string(PhaseClean) {
			cleanP95 = r.Phases[i].Pickup.P95
		}
	}
	if cleanP95 <= 0 {
		return
	}
	for i := range r.Phases {
		p := &r.Phases[i]
		p.PickupP95VsClean = harness.Round2(p.Pickup.P95 / cleanP95)
		if p.Kind != string(PhaseClean) {
			p.SettledAfterS = r.settledAfter(i, settleFactor*cleanP95)
		}
	}
}

// summarisePhase fills in phase i from its samples.
func (r *Result) summarisePhase(i int) {
	p := &r.Phases[i]
	span := r.phaseAt[i]
	p.StartS, p.EndS = r.rel(span.start), r.rel(span.end)
	var (
		pickups                          []float64
		enqueued, succeeded, finished, s float64
		busy                             float64
		first, last, before              = -1, -1, -1
	)
	for k := range r.Samples {
		sm := &r.Samples[k]
		if !sm.windowMid.IsZero() && r.within(sm.windowMid, i) {
			w := sm.WindowEnd - sm.WindowStart
			enqueued += sm.EnqueuedPerSec * w
			succeeded += sm.SucceededPerSec * w
			finished += sm.FinishedPerSec * w
			s += w
			pickups = append(pickups, sm.pickups...)
		}
		switch {
		case r.within(sm.at, i):
			if first < 0 {
				first = k
			}
			last = k
		default:
			if first < 0 && sm.at.Before(span.start) {
				before = k
			}
		}
	}
	p.Pickup = harness.PercentilesOf(pickups)
	if s > 0 {
		p.EnqueuedPerSec = harness.Round2(enqueued / s)
		p.SucceededPerSec = harness.Round2(succeeded / s)
		p.FinishedPerSec = harness.Round2(finished / s)
	}
	if enqueued > 0 {
		p.KeptUp = harness.Round3(succeeded / enqueued)
	}
	if first < 0 {
		return
	}
	p.Samples = last - first + 1
	f, l := r.Samples[first], r.Samples[last]
	p.TableBytesStart, p.TableBytesEnd = f.TableBytes, l.TableBytes
	p.IndexBytesStart, p.IndexBytesEnd = f.IndexBytes, l.IndexBytes
	p.Tables = l.Tables
	p.BacklogEnd, p.DeadTuplesEnd = l.Backlog.Ready, l.DeadTuples
	var steal float64
	for _, sm := range r.Samples[first : last+1] {
		p.BacklogMax = max(p.BacklogMax, sm.Backlog.Ready)
		p.OldestReadyMsMax = max(p.OldestReadyMsMax, sm.Backlog.OldestReadyMs)
		p.DeadTuplesMax = max(p.DeadTuplesMax, sm.DeadTuples)
		p.HorizonAgeMax = max(p.HorizonAgeMax, sm.HorizonAge)
		p.OldestTransactionMsMax = max(p.OldestTransactionMsMax, sm.OldestTransactionMs)
		busy += sm.CPUBusy
		steal += sm.StealS
	}
	p.CPUBusy = harness.Round3(busy / float64(p.Samples))
	p.StealS = harness.Round3(steal)
	// WAL and autovacuum runs count from the sample before the phase (the
	// run's start for the first).
	var walFrom int64
	fromAt, vacFrom := r.start, r.startAutovacuums
	if before >= 0 {
		b := r.Samples[before]
		walFrom, fromAt, vacFrom = b.WALBytes, b.at, autovacuums(b)
	}
	p.WALBytes = l.WALBytes - walFrom
	if d := l.at.Sub(fromAt).Seconds(); d > 0 {
		p.WALBytesPerSec = harness.Round2(float64(p.WALBytes) / d)
	}
	if succeeded > 0 {
		p.WALBytesPerJob = harness.Round2(float64(p.WALBytes) / succeeded)
	}
	p.Autovacuums = autovacuums(l) - vacFrom
}

// settledAfter returns how long after phase i began its windows' pickup
// p95 came back within limit and stayed there, or nil.
func (r *Result) settledAfter(i int, limit float64) *float64 {
	var from *Sample
	for k := range r.Samples {
		sm := &r.Samples[k]
		if sm.windowMid.IsZero() || !r.within(sm.windowMid, i) || sm.Pickup.N == 0 {
			continue
		}
		switch {
		case sm.Pickup.P95 > limit:
			from = nil
		case from == nil:
			from = sm
		}
	}
	if from == nil {
		return nil
	}
	v := harness.Round3(max(from.WindowStart-r.Phases[i].StartS, 0))
	return &v
}

// autovacuums sums the autovacuum runs of every table at a sample.
func autovacuums(s Sample) int64 {
	var n int64
	for _, t := range s.Tables {
		n += t.Autovacuums
	}
	return n
}

// rel is t in seconds since the run's start.
func (r *Result) rel(t time.Time) float64 { return harness.Round3(t.Sub(r.start).Seconds()) }

// write writes the JSON result and the chart under outDir.
func (r *Result) write(outDir string) error {
	name := "soak"
	if r.System != "relay" {
		name += "-" + r.System
	}
	base, err := harness.ResultBase(outDir, name, r.Environment.Date)
	if err != nil {
		return err
	}
	chart := base + ".svg"
	if err := writeChart(r, chart); err != nil {
		return err
	}
	r.Files = []string{base + ".json", chart}
	return harness.WriteJSON(base+".json", r)
}

// WriteSummary prints each phase's figures as a table.
func (r *Result) WriteSummary(w io.Writer) error {
	fmt.Fprintf(w, "%s on a %s (PostgreSQL %s, autovacuum %s, shared_buffers %s); %s workers, %s jobs of %d ms, %.0f jobs/s offered, samples every %g s\n\n",
		r.System, r.Server, r.Environment.PostgreSQL.Version, r.Environment.PostgreSQL.Autovacuum, r.Environment.PostgreSQL.SharedBuffers,
		r.Settings.Workers, r.Settings.JobKind, r.Settings.JobMs, r.Settings.RatePerSec, r.Settings.IntervalS)
	if r.Settings.RetainSucceededS != 0 {
		fmt.Fprintf(w, "succeeded jobs kept %g s\n\n", r.Settings.RetainSucceededS)
	}
	if r.Settings.ReadersNice != 0 {
		fmt.Fprintf(w, "the readers' backends at nice %d\n\n", r.Settings.ReadersNice)
	}
	for _, p := range r.Phases {
		if a := p.Readers; a != nil && a.Apart != nil {
			fmt.Fprintf(w, "the readers counted a table apart: %d jobs, %.1f MB, a count %.1f ms (the queue's job table: %.1f MB, a count %.1f ms), in database %s\n\n",
				a.Apart.Rows, mb(a.Apart.TableBytes), a.Apart.CountMs, mb(a.Apart.JobTableBytes), a.Apart.JobTableCountMs, a.Apart.Database)
		}
	}
	tw := harness.NewTable(w)
	fmt.Fprintf(tw, "phase\tseconds\toffered/s\tdone/s\tkept up\tpickup p50/p95/p99 ms\tp95/clean\tsettled after\tbacklog max\ttables+indexes MB\tdead max\tautovacuums\tWAL MB/s\tWAL B/job\thorizon max xids\toldest tx s\tCPU busy\n")
	for _, p := range r.Phases {
		settled := "-"
		if p.SettledAfterS != nil {
			settled = fmt.Sprintf("%.0f s", *p.SettledAfterS)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.3f\t%.1f/%.1f/%.1f\t%.2f\t%s\t%d\t%.1f→%.1f\t%d\t%d\t%.2f\t%.0f\t%d\t%.0f\t%.0f%%\n",
			p.Kind, p.EndS-p.StartS, p.EnqueuedPerSec, p.SucceededPerSec, p.KeptUp,
			p.Pickup.P50, p.Pickup.P95, p.Pickup.P99, p.PickupP95VsClean, settled, p.BacklogMax,
			mb(p.TableBytesStart+p.IndexBytesStart), mb(p.TableBytesEnd+p.IndexBytesEnd), p.DeadTuplesMax, p.Autovacuums,
			p.WALBytesPerSec/1e6, p.WALBytesPerJob, p.HorizonAgeMax, p.OldestTransactionMsMax/1000, 100*p.CPUBusy)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Files {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
	return nil
}

// mb is bytes in megabytes.
func mb(b int64) float64 { return float64(b) / 1e6 }
