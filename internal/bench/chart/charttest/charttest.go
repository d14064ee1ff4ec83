// Package charttest decodes the PNG that a chart or a report writes, for the
// tests of the lab packages that draw them. Only tests import it.
package charttest

import (
	"bytes"
	"image"
	"image/png"
	"io"
	"testing"
)

// PNG is the image that w writes; it fails the test if w fails to write it
// or writes something that is not a PNG.
func PNG(t testing.TB, w interface{ WritePNG(io.Writer) error }) image.Image {
	t.Helper()
	var buf bytes.Buffer
	if err := w.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
