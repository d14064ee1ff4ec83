package chart

import (
	"bytes"
	"image/color"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/internal/bench/chart/charttest"
)

func TestLineWritePNG(t *testing.T) {
	red := color.RGBA{0xff, 0, 0, 0xff}
	c := Line{Title: "T", XLabel: "X", YLabel: "Y", XTicks: []float64{1, 2},
		Series: []Series{{Label: "A", Color: red, X: []float64{1, 2}, Y: []float64{3, 7}}}}
	img := charttest.PNG(t, c)
	found := false
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y && !found; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r == 0xffff && g == 0 && bl == 0 {
				found = true
				break
			}
		}
	}
	if !found {
		t.Error("the series' colour is nowhere in the image")
	}

	// An empty chart still draws; a ragged series is refused by name.
	if err := (Line{}).WritePNG(&bytes.Buffer{}); err != nil {
		t.Errorf("empty chart: %v", err)
	}
	err := Line{Series: []Series{{Label: "ragged", X: []float64{1}}}}.WritePNG(&bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "ragged") {
		t.Errorf("ragged series: err = %v", err)
	}
}

func TestNiceAxis(t *testing.T) {
	for _, tt := range []struct{ v, top, step float64 }{{0, 1, 0.25}, {7, 7, 1}, {64, 70, 10}, {273, 300, 50}} {
		if top, step := niceAxis(tt.v); top != tt.top || step != tt.step {
			t.Errorf("niceAxis(%v) = %v, %v; want %v, %v", tt.v, top, step, tt.top, tt.step)
		}
	}
}
