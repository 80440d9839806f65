package crash

import (
	"fmt"
	"image/color"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// timelineChart draws each trial's events on one row, in seconds from
// the kill (or, for the zombie, from the SIGSTOP).
func timelineChart(r *Result, path string) error {
	p := plot.New()
	p.Title.Text = "Crash timeline (database clock), seconds from the kill / SIGSTOP"
	p.X.Label.Text = "seconds"
	type row struct {
		name                         string
		origin                       time.Time
		claim1, reclaim, claim2, end time.Time
		resume, reject               time.Time
	}
	var rows []row
	for _, t := range r.Trials {
		rows = append(rows, row{name: fmt.Sprintf("kill %d", t.Trial), origin: t.Kill,
			claim1: t.Claim1, reclaim: t.Reclaim, claim2: t.Claim2, end: t.Completion})
	}
	if z := r.Zombie; z != nil {
		rows = append(rows, row{name: "zombie", origin: z.Pause, claim1: z.Claim1, reclaim: z.Reclaim,
			claim2: z.Claim2, end: z.Completion, resume: z.Resume, reject: z.RejectedAck})
	}
	// Rows from the top: the first trial highest.
	y := func(i int) float64 { return float64(len(rows) - 1 - i) }
	names := make([]string, len(rows))
	for i, rw := range rows {
		names[len(rows)-1-i] = rw.name
	}

	// The attempts as bars: attempt 1 from claim 1 to the kill, attempt 2
	// from claim 2 to completion.
	for i, rw := range rows {
		for k, seg := range [][2]time.Time{{rw.claim1, rw.origin}, {rw.claim2, rw.end}} {
			if seg[0].IsZero() || seg[1].IsZero() {
				continue
			}
			l, err := plotter.NewLine(plotter.XYs{
				{X: seg[0].Sub(rw.origin).Seconds(), Y: y(i)},
				{X: seg[1].Sub(rw.origin).Seconds(), Y: y(i)},
			})
			if err != nil {
				return fmt.Errorf("timeline chart: %w", err)
			}
			l.Width = vg.Points(6)
			l.Color = plotutil.Color(k)
			if i == 0 {
				p.Legend.Add([]string{"attempt 1 running", "attempt 2 running"}[k], l)
			}
			p.Add(l)
		}
	}
	events := []struct {
		label string
		shape draw.GlyphDrawer
		clr   color.Color
		pick  func(row) time.Time
	}{
		{"claim 1", draw.CircleGlyph{}, plotutil.Color(0), func(r row) time.Time { return r.claim1 }},
		{"kill / SIGSTOP", draw.CrossGlyph{}, color.Black, func(r row) time.Time { return r.origin }},
		{"reclaim", draw.TriangleGlyph{}, plotutil.Color(2), func(r row) time.Time { return r.reclaim }},
		{"claim 2", draw.CircleGlyph{}, plotutil.Color(1), func(r row) time.Time { return r.claim2 }},
		{"completion", draw.BoxGlyph{}, plotutil.Color(3), func(r row) time.Time { return r.end }},
		{"SIGCONT", draw.PlusGlyph{}, plotutil.Color(4), func(r row) time.Time { return r.resume }},
		{"stale ack rejected", draw.RingGlyph{}, color.RGBA{R: 220, A: 255}, func(r row) time.Time { return r.reject }},
	}
	for _, ev := range events {
		var xys plotter.XYs
		for i, rw := range rows {
			if at := ev.pick(rw); !at.IsZero() {
				xys = append(xys, plotter.XY{X: at.Sub(rw.origin).Seconds(), Y: y(i)})
			}
		}
		if len(xys) == 0 {
			continue
		}
		s, err := plotter.NewScatter(xys)
		if err != nil {
			return fmt.Errorf("timeline chart: %w", err)
		}
		s.Shape = ev.shape
		s.Color = ev.clr
		s.Radius = vg.Points(4)
		p.Add(s)
		p.Legend.Add(ev.label, s)
	}
	p.NominalY(names...)
	p.Y.Padding = vg.Points(10)
	// Room on the right for the legend.
	p.X.Max += 0.45 * (p.X.Max - p.X.Min)
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	height := harness.ChartHeight
	if len(rows) > 8 {
		height = vg.Length(len(rows)) * vg.Points(28)
	}
	return harness.SaveSized(p, harness.ChartWidth, height, path)
}
