package scale

import (
	"image/color"
	"io"

	"github.com/tessera-dev/tessera/internal/bench/chart"
)

var workloadColors = map[string]color.RGBA{
	"plain":          {0x7f, 0x7f, 0x7f, 0xff},
	"whole-claim":    {0xd6, 0x27, 0x28, 0xff},
	"whole-extended": {0xff, 0x7f, 0x0e, 0xff},
	"share":          {0x1f, 0x77, 0xb4, 0xff},
	"share-cel":      {0x2c, 0xa0, 0x2c, 0xff},
	"nvlink-pair":    {0x94, 0x67, 0xbd, 0xff},
}

// WritePNG plots pods/s against cluster size, one line per workload, with the
// upstream threshold as a flat line.
func (r *Report) WritePNG(w io.Writer) error {
	nodes := r.NodeCounts()
	c := chart.Line{
		Title:  "KUBE-SCHEDULER PODS/S ON KWOK NODES (8 GPUS EACH)",
		XLabel: "NODES",
		YLabel: "PODS/S",
	}
	for _, n := range nodes {
		c.XTicks = append(c.XTicks, float64(n))
	}
	for _, name := range r.Workloads() {
		s := chart.Series{Label: name, Color: workloadColors[name]}
		for _, n := range nodes {
			if res, ok := r.Find(name, n); ok {
				s.X = append(s.X, float64(n))
				s.Y = append(s.Y, finite(res.PodsPerSecond))
			}
		}
		c.Series = append(c.Series, s)
	}
	if len(nodes) > 0 {
		c.Series = append(c.Series, chart.Series{
			Label: "UPSTREAM MIN 64",
			Color: color.RGBA{0, 0, 0, 0xff},
			X:     []float64{float64(nodes[0]), float64(nodes[len(nodes)-1])},
			Y:     []float64{AnchorThreshold, AnchorThreshold},
		})
	}
	return c.WritePNG(w)
}
