package fleet

import (
	"fmt"
	"image/color"
	"io"
	"sort"

	"github.com/tessera-dev/tessera/internal/bench/chart"
)

var kindColors = map[Kind]color.RGBA{
	Whole:          {0xd6, 0x27, 0x28, 0xff},
	Partition:      {0xff, 0x7f, 0x0e, 0xff},
	Tessera:        {0x1f, 0x77, 0xb4, 0xff},
	TesseraBestFit: {0x2c, 0xa0, 0x2c, 0xff},
	Migrating:      {0x94, 0x67, 0xbd, 0xff},
	Fluid:          {0x7f, 0x7f, 0x7f, 0xff},
}

var kindLabels = map[Kind]string{
	Whole:          "(A) WHOLE GPU",
	Partition:      "(B) PARTITIONS",
	Tessera:        "(C) TESSERA",
	TesseraBestFit: "(C') BEST-FIT",
	Migrating:      "(D) MIGRATING REF",
	Fluid:          "(E) FLUID",
}

// WritePNG draws throughput (jobs/h) against mean demand, one line per model.
func (r *Report) WritePNG(w io.Writer) error {
	order := make([]int, len(r.Means))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return r.Means[order[a]] < r.Means[order[b]] })
	c := chart.Line{
		Title:  fmt.Sprintf("SIMULATED THROUGHPUT VS MEAN GPU DEMAND (%d GPUS)", r.Fleet.GPUs()),
		XLabel: "MEAN GPU DEMAND M",
		YLabel: "JOBS/H",
		XTicks: r.Means,
	}
	for k, kind := range AllKinds {
		s := chart.Series{Label: kindLabels[kind], Color: kindColors[kind]}
		for _, i := range order {
			if r.Results[i][k].Skipped != "" {
				continue
			}
			s.X = append(s.X, r.Means[i])
			s.Y = append(s.Y, r.Results[i][k].JobsPerHour)
		}
		if len(s.X) > 0 {
			c.Series = append(c.Series, s)
		}
	}
	if len(r.Bounds) == len(r.Means) {
		s := chart.Series{Label: "(F) BOUND (SERVED/H)", Color: color.RGBA{0x17, 0xbe, 0xcf, 0xff}}
		for _, i := range order {
			s.X = append(s.X, r.Means[i])
			s.Y = append(s.Y, r.Bounds[i].Served.Value)
		}
		c.Series = append(c.Series, s)
	}
	return c.WritePNG(w)
}
