package harness

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
)

// Chart sizes.
const (
	ChartWidth  = 7 * vg.Inch
	ChartHeight = 4.5 * vg.Inch
)

func SaveChart(p *plot.Plot, path string) error { return SaveSized(p, ChartWidth, ChartHeight, path) }

func SaveSized(p *plot.Plot, w, h vg.Length, path string) error {
	if err := p.Save(w, h, path); err != nil {
		return fmt.Errorf("write chart %s: %w", path, err)
	}
	return nil
}
