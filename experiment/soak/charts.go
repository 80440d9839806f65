package soak

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Chart size: one panel per figure, stacked over a shared time axis.
const (
	chartWidth  = 9 * vg.Inch
	panelHeight = 2.2 * vg.Inch
)

// panel is one figure of the chart: its title, unit and lines.
type panel struct {
	title, unit string
	lines       []series
	// logY draws the values on a logarithmic scale.
	logY bool
}

// series is one line of a panel.
type series struct {
	label string
	value func(Sample) float64
	// jobs places the value at its job window's end rather than at the
	// sample's time.
	jobs bool
}

// writeChart draws the soak over time, one panel per figure, with the
// phases shaded, to path, in the format its extension names (svg, png).
func writeChart(r *Result, path string) error {
	largest := ""
	if n := len(r.Samples); n > 0 {
		largest = r.Samples[n-1].LargestIndex
	}
	panels := []panel{
		{title: "jobs per second: offered (enqueued) and completed (succeeded)", unit: "jobs/s", lines: []series{
			{"enqueued", func(s Sample) float64 { return s.EnqueuedPerSec }, true},
			{"succeeded", func(s Sample) float64 { return s.SucceededPerSec }, true},
		}},
		{title: "pickup latency, ready to claimed (log scale)", unit: "ms", logY: true, lines: []series{
			{"p50", func(s Sample) float64 { return s.Pickup.P50 }, true},
			{"p95", func(s Sample) float64 { return s.Pickup.P95 }, true},
			{"p99", func(s Sample) float64 { return s.Pickup.P99 }, true},
		}},
		{title: "backlog: ready jobs waiting", unit: "jobs", lines: []series{
			{"ready", func(s Sample) float64 { return float64(s.Backlog.Ready) }, false},
		}},
		{title: "size on disk of every table and index; the largest index at the end is " + largest, unit: "MB", lines: []series{
			{"tables", func(s Sample) float64 { return mb(s.TableBytes) }, false},
			{"indexes", func(s Sample) float64 { return mb(s.IndexBytes) }, false},
			{"largest index", func(s Sample) float64 { return mb(s.Indexes[largest]) }, false},
		}},
		{title: "dead row versions, every table", unit: "tuples", lines: []series{
			{"dead", func(s Sample) float64 { return float64(s.DeadTuples) }, false},
		}},
		{title: "WAL written (whole server)", unit: "MB/s", lines: []series{
			{"WAL", func(s Sample) float64 { return s.WALBytesPerSec / 1e6 }, false},
		}},
		{title: "age of the xmin horizon", unit: "transactions", lines: []series{
			{"oldest backend_xmin", func(s Sample) float64 { return float64(s.XminAge) }, false},
			{"oldest backend_xid", func(s Sample) float64 { return float64(s.XidAge) }, false},
		}},
	}
	plots := make([][]*plot.Plot, len(panels))
	for i, pn := range panels {
		p, err := drawPanel(r, pn, i == 0, i == len(panels)-1)
		if err != nil {
			return fmt.Errorf("soak chart: %s: %w", pn.title, err)
		}
		plots[i] = []*plot.Plot{p}
	}
	height := panelHeight * vg.Length(len(panels))
	img, err := draw.NewFormattedCanvas(chartWidth, height, strings.TrimPrefix(filepath.Ext(path), "."))
	if err != nil {
		return fmt.Errorf("soak chart: %w", err)
	}
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8), PadY: vg.Points(6)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write chart %s: %w", path, err)
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write chart %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write chart %s: %w", path, err)
	}
	return nil
}

// drawPanel draws one panel: its lines over the phases' bands, labelled
// with the phases' names if top, with the time axis's label if bottom.
func drawPanel(r *Result, pn panel, top, bottom bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.Y.Label.Text = pn.unit
	if bottom {
		p.X.Label.Text = "seconds since the start (database clock)"
	}
	if len(r.phaseAt) > 0 {
		p.X.Min, p.X.Max = 0, r.rel(r.phaseAt[len(r.phaseAt)-1].end)
	}
	p.Add(&phaseBands{r: r, labels: top})
	p.Add(plotter.NewGrid())
	for i, s := range pn.lines {
		var xys plotter.XYs
		for _, sm := range r.Samples {
			x := sm.At
			if s.jobs {
				if sm.windowMid.IsZero() {
					continue
				}
				x = sm.WindowEnd
			}
			y := s.value(sm)
			if pn.logY {
				// A log scale has no zero: an empty window is left out, a
				// latency under 10 µs drawn at 10 µs.
				if s.jobs && sm.Pickup.N == 0 {
					continue
				}
				y = max(y, 0.01)
			}
			xys = append(xys, plotter.XY{X: x, Y: y})
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(s.label, l)
	}
	if pn.logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	} else {
		p.Y.Min = 0
		p.Y.Tick.Marker = plainTicks
	}
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	return p, nil
}

// phaseBands shades every other phase and, on the top panel, names each
// at the foot of its band, below the lines of rates.
// It has no data range: the lines decide the axes.
type phaseBands struct {
	r      *Result
	labels bool
}

// Plot implements plot.Plotter.
func (b *phaseBands) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	shade := color.Gray{Y: 232}
	for i, span := range b.r.phaseAt {
		x0, x1 := trX(b.r.rel(span.start)), trX(b.r.rel(span.end))
		if i%2 == 1 {
			c.FillPolygon(shade, []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}})
		}
		if b.labels {
			sty := draw.TextStyle{Color: color.Gray{Y: 80}, Font: plot.DefaultFont, Handler: p.Title.TextStyle.Handler, XAlign: draw.XCenter, YAlign: draw.YBottom}
			sty.Font.Size = vg.Points(8)
			c.FillText(sty, vg.Point{X: (x0 + x1) / 2, Y: c.Min.Y + vg.Points(3)}, string(span.kind))
		}
	}
}

// plainTicks are gonum's default ticks, labelled without trailing zeros
// (75000, not 75000.00).
var plainTicks = plot.TickerFunc(func(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'g', -1, 64)
		}
	}
	return ticks
})
