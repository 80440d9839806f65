package burst

import (
	"fmt"
	"image/color"
	"sort"

	"github.com/relayq/relay/experiment/harness"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// cdfPoints is how many points a CDF line keeps at most.
const cdfPoints = 400

// throughputChart draws, per configuration, the measured throughput and
// the reference study's as fractions of the configuration's bound (slots /
// sleep), each bar labelled with its jobs/s, against the target.
func throughputChart(r *Result, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Burst throughput against the bound: %d hash jobs (sleep %d ms, %d iterations)",
		r.Settings.Jobs, r.Settings.Workload.SleepMs, r.Settings.Workload.Iterations)
	p.Y.Label.Text = "throughput / bound (slots ÷ sleep)"
	p.X.Label.Text = "processes × slots (bound in jobs/s)"
	p.Y.Min, p.Y.Max = 0, 1.12
	var names []string
	measured, reference := plotter.Values{}, plotter.Values{}
	for _, run := range r.Runs {
		names = append(names, fmt.Sprintf("%s (%.0f/s)", run.Config, run.Bound))
		measured = append(measured, run.Efficiency)
		ref := 0.0
		if run.Bound > 0 {
			ref = run.Reference / run.Bound
		}
		reference = append(reference, ref)
	}
	w := vg.Points(40)
	bars := []struct {
		label string
		vals  plotter.Values
		rate  func(ConfigRun) float64
	}{
		{"Relay, measured", measured, func(b ConfigRun) float64 { return b.Throughput }},
		{"reference study", reference, func(b ConfigRun) float64 { return b.Reference }},
	}
	for i, b := range bars {
		bc, err := plotter.NewBarChart(b.vals, w)
		if err != nil {
			return fmt.Errorf("throughput chart: %w", err)
		}
		bc.Color = plotutil.Color(i)
		bc.LineStyle.Width = vg.Length(0)
		bc.Offset = (vg.Length(i) - 0.5) * w
		p.Add(bc)
		p.Legend.Add(b.label, bc)
		// Each bar's rate above it.
		var xys plotter.XYs
		var texts []string
		for k, run := range r.Runs {
			if b.vals[k] == 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: float64(k), Y: b.vals[k]})
			texts = append(texts, fmt.Sprintf("%.0f/s", b.rate(run)))
		}
		if len(xys) > 0 {
			labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
			if err != nil {
				return fmt.Errorf("throughput chart: %w", err)
			}
			for j := range labels.TextStyle {
				labels.TextStyle[j].XAlign = draw.XCenter
			}
			labels.Offset = vg.Point{X: (vg.Length(i) - 0.5) * w, Y: vg.Points(3)}
			p.Add(labels)
		}
	}
	for _, ref := range []struct {
		y     float64
		label string
		dash  bool
	}{{1, "bound", false}, {r.TargetEfficiency, fmt.Sprintf("target (%.2f)", r.TargetEfficiency), true}} {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: ref.y}, {X: float64(len(r.Runs)) - 0.5, Y: ref.y}})
		if err != nil {
			return fmt.Errorf("throughput chart: %w", err)
		}
		l.Color = color.Gray{Y: 90}
		if ref.dash {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(ref.label, l)
	}
	p.Legend.Top = true
	p.Legend.Left = false
	p.NominalX(names...)
	p.Add(plotter.NewGrid())
	return harness.SaveChart(p, path)
}

// latencyChart draws the distribution (CDF) of completion time, solid, and
// of queue wait, dashed, for every configuration.
func latencyChart(r *Result, path string) error {
	p := plot.New()
	p.Title.Text = "Burst latency: completion (solid) and queue wait (dashed)"
	p.X.Label.Text = "seconds after the job was created"
	p.Y.Label.Text = "fraction of jobs"
	p.Y.Min, p.Y.Max = 0, 1
	for i, run := range r.Runs {
		var wait, done []float64
		for _, j := range run.JobTimings {
			wait = append(wait, (j.Started-j.Created)/1000)
			done = append(done, (j.Finished-j.Created)/1000)
		}
		for k, series := range [][]float64{done, wait} {
			l, err := plotter.NewLine(cdf(series))
			if err != nil {
				return fmt.Errorf("latency chart: %w", err)
			}
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.5)
			if k == 1 {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			} else {
				p.Legend.Add(fmt.Sprintf("%s: completion p95 %.1f s", run.Config, run.Completion.P95/1000), l)
			}
			p.Add(l)
		}
	}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(5)
	p.Legend.YOffs = vg.Points(5)
	p.Add(plotter.NewGrid())
	return harness.SaveChart(p, path)
}

// cdf returns the empirical distribution of vals, thinned to cdfPoints.
func cdf(vals []float64) plotter.XYs {
	s := append([]float64(nil), vals...)
	sort.Float64s(s)
	n := len(s)
	step := max(1, n/cdfPoints)
	xys := plotter.XYs{{X: 0, Y: 0}}
	for i := 0; i < n; i += step {
		xys = append(xys, plotter.XY{X: s[i], Y: float64(i+1) / float64(n)})
	}
	if n > 0 {
		xys = append(xys, plotter.XY{X: s[n-1], Y: 1})
	}
	return xys
}
