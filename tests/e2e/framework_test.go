//go:build e2e

package e2e

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseCRILog(t *testing.T) {
	in := "2026-11-22T05:20:35.1Z stdout F A=1\n" +
		"2026-11-22T05:20:35.2Z stdout P B=\n" +
		"2026-11-22T05:20:35.3Z stdout F two\n" +
		"2026-11-22T05:20:35.4Z stderr F \n"
	if got, want := ParseCRILog(in), "A=1\nB=two\n\n"; got != want {
		t.Errorf("ParseCRILog = %q, want %q", got, want)
	}
}

func TestParseEnv(t *testing.T) {
	log := "A=1\nB=x=y\nnot env\n" + EnvDoneMarker + "\nC=after\n"
	want := map[string]string{"A": "1", "B": "x=y"}
	if diff := cmp.Diff(want, ParseEnv(log)); diff != "" {
		t.Errorf("ParseEnv (-want +got):\n%s", diff)
	}
}
