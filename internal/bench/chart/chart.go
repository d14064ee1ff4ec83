// Package chart draws simple PNG line charts with the standard library only
// (image/png and a 3×5 bitmap font): a benchmark report's one plot does not
// justify a plotting dependency in go.mod. The fleet simulation's and the
// scale benchmark's plots are drawn with it.
package chart

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strconv"
	"strings"
)

// Series is one line of a Line chart: points (X[i], Y[i]) joined in order.
type Series struct {
	Label string
	Color color.RGBA
	X, Y  []float64
}

// Line is a line chart over a numeric x axis. XTicks are the labelled x
// positions; the y axis starts at 0 and ends at a round number above the data.
type Line struct {
	Title, XLabel, YLabel string
	XTicks                []float64
	Series                []Series
}

// WritePNG draws the chart as a 900×560 PNG with the legend on the right. It
// returns an error for a series whose X and Y differ in length.
func (c Line) WritePNG(w io.Writer) error {
	const (
		width, height            = 900, 560
		left, right, top, bottom = 90, 230, 50, 70
	)
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("series %q: %d x values but %d y values", s.Label, len(s.X), len(s.Y))
		}
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), color.RGBA{0xff, 0xff, 0xff, 0xff})
	black := color.RGBA{0, 0, 0, 0xff}
	grey := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}

	maxY, xMin, xMax := 0.0, math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			maxY = max(maxY, s.Y[i])
			xMin, xMax = min(xMin, s.X[i]), max(xMax, s.X[i])
		}
	}
	for _, x := range c.XTicks {
		xMin, xMax = min(xMin, x), max(xMax, x)
	}
	if math.IsInf(xMin, 0) {
		xMin, xMax = 0, 1
	}
	if xMax == xMin {
		xMin, xMax = xMin-1, xMax+1
	}
	pad := (xMax - xMin) * 0.05
	xMin, xMax = xMin-pad, xMax+pad
	yMax, yStep := niceAxis(maxY)
	px := func(x float64) int { return left + int(math.Round((x-xMin)/(xMax-xMin)*float64(width-left-right))) }
	py := func(y float64) int { return height - bottom - int(math.Round(y/yMax*float64(height-top-bottom))) }

	for y := 0.0; y <= yMax+1e-9; y += yStep {
		line(img, px(xMin), py(y), px(xMax), py(y), grey, 1)
		s := strconv.FormatFloat(y, 'f', -1, 64)
		text(img, left-10-textWidth(s, 2), py(y)-5, s, black, 2)
	}
	for _, x := range c.XTicks {
		line(img, px(x), height-bottom, px(x), height-bottom+6, black, 1)
		s := strconv.FormatFloat(x, 'f', -1, 64)
		text(img, px(x)-textWidth(s, 2)/2, height-bottom+12, s, black, 2)
	}
	line(img, px(xMin), height-bottom, px(xMax), height-bottom, black, 1)
	line(img, px(xMin), top, px(xMin), height-bottom, black, 1)
	text(img, left, 15, c.Title, black, 3)
	text(img, 10, top-16, c.YLabel, black, 2)
	text(img, px((xMin+xMax)/2)-textWidth(c.XLabel, 2)/2, height-bottom+36, c.XLabel, black, 2)

	for k, s := range c.Series {
		for i := range s.X {
			x, y := px(s.X[i]), py(s.Y[i])
			fill(img, image.Rect(x-3, y-3, x+4, y+4), s.Color)
			if i > 0 {
				line(img, px(s.X[i-1]), py(s.Y[i-1]), x, y, s.Color, 2)
			}
		}
		ly := top + 20 + 28*k
		line(img, width-right+20, ly+5, width-right+50, ly+5, s.Color, 3)
		text(img, width-right+58, ly, s.Label, black, 2)
	}
	return png.Encode(w, img)
}

// niceAxis returns a round axis maximum ≥ v and a tick step giving 4–8 ticks.
func niceAxis(v float64) (top, step float64) {
	if v <= 0 {
		return 1, 0.25
	}
	mag := math.Pow(10, math.Floor(math.Log10(v)))
	for _, f := range []float64{0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5} {
		step = f * mag
		if math.Ceil(v/step) <= 8 {
			break
		}
	}
	return math.Ceil(v/step) * step, step
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// line draws a segment of the given thickness (Bresenham with a square pen).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, thick int) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		fill(img, image.Rect(x0-(thick-1)/2, y0-(thick-1)/2, x0+thick/2+1, y0+thick/2+1), c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

func textWidth(s string, scale int) int { return len(s) * 4 * scale }

// text draws s in the 3×5 font, scaled; unknown characters are blank.
func text(img *image.RGBA, x, y int, s string, c color.RGBA, scale int) {
	for i, ch := range strings.ToUpper(s) {
		g := glyphs[ch]
		for row := range 5 {
			for col := range 3 {
				if len(g) == 15 && g[row*3+col] == '#' {
					fill(img, image.Rect(x+(i*4+col)*scale, y+row*scale, x+(i*4+col+1)*scale, y+(row+1)*scale), c)
				}
			}
		}
	}
}

// glyphs is a 3×5 font: five rows of three pixels, row-major.
var glyphs = map[rune]string{
	'0': "####.##.##.####", '1': ".#.##..#..#.###", '2': "###..#####..###", '3': "###..#.##..####",
	'4': "#.##.####..#..#", '5': "####..###..####", '6': "####..####.####", '7': "###..#.#..#..#.",
	'8': "####.#####.####", '9': "####.####..####", 'A': ".#.#.#####.##.#", 'B': "##.#.###.#.###.",
	'C': ".###..#..#...##", 'D': "##.#.##.##.###.", 'E': "####..##.#..###", 'F': "####..##.#..#..",
	'G': ".###..#.##.#.##", 'H': "#.##.#####.##.#", 'I': "###.#..#..#.###", 'J': "..#..#..##.#.#.",
	'K': "#.##.###.#.##.#", 'L': "#..#..#..#..###", 'M': "#.########.##.#", 'N': "##.#.##.##.##.#",
	'O': ".#.#.##.##.#.#.", 'P': "##.#.###.#..#..", 'Q': ".#.#.##.###..##", 'R': "##.#.###.#.##.#",
	'S': ".###...#...###.", 'T': "###.#..#..#..#.", 'U': "#.##.##.##.####", 'V': "#.##.##.##.#.#.",
	'W': "#.##.########.#", 'X': "#.##.#.#.#.##.#", 'Y': "#.##.#.#..#..#.", 'Z': "###..#.#.#..###",
	'.': ".............#.", '/': "..#..#.#.#..#..", '(': ".#.#..#..#...#.", ')': ".#...#..#..#.#.",
	'-': "......###......", '=': "...###...###...", ':': "....#.....#....", '\'': ".#..#..........",
	',': "..........#.#..", '%': "#.#..#.#.#..#.#",
}
