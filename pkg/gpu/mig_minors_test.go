package gpu

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestParseMIGMinors(t *testing.T) {
	in := strings.Join([]string{
		"config 1",
		"monitor 2",
		"gpu0/gi0/access 3",
		"gpu0/gi0/ci0/access 4",
		"",
		"gpu0/gi1/access 12",
		"gpu0/gi1/ci0/access 13",
		"  gpu3/gi3/ci3/access   439  ", // spacing does not matter
		"gpu0/gi1/access",               // no minor
		"gpu0/gi2/access 21 22",         // two
		"gpu0/gi2/acces 21",             // unknown capability
		"gpu0/gi2/ci0/ci1/access 23",    // too deep
		"gpux/gi2/access 21",            // not a number
		"gpu0/gi02/access 21",           // leading zero
		"gpu0/gi2/access -21",           // negative
		"gpu0/gi2/access 0x15",          // not decimal
		"gpu0/gi1/access 99",            // listed twice: the first stays
		"mig/config 1",                  // the proc path, not the capability
	}, "\n")
	m, err := ParseMIGMinors(strings.NewReader(in))
	want := MIGMinors{"config": 1, "monitor": 2, "gpu0/gi0/access": 3, "gpu0/gi0/ci0/access": 4, "gpu0/gi1/access": 12,
		"gpu0/gi1/ci0/access": 13, "gpu3/gi3/ci3/access": 439}
	if len(m) != len(want) {
		t.Errorf("parsed %v, want %v", m, want)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %d, want %d", k, m[k], v)
		}
	}
	if err == nil {
		t.Fatal("no error for the malformed lines")
	}
	// Every malformed line is reported with its number, the good ones not.
	for _, line := range []int{9, 10, 11, 12, 13, 14, 15, 16, 17, 18} {
		if !strings.Contains(err.Error(), "line "+strconv.Itoa(line)+" ") {
			t.Errorf("error does not report line %d:\n%v", line, err)
		}
	}
	for _, line := range []int{1, 2, 3, 4, 5, 6, 7, 8} {
		if strings.Contains(err.Error(), "line "+strconv.Itoa(line)+" ") {
			t.Errorf("error reports good line %d:\n%v", line, err)
		}
	}

	if got := m.GPUInstance(0, 1); got != 12 {
		t.Errorf("GPUInstance(0, 1) = %d, want 12", got)
	}
	if got := m.ComputeInstance(3, 3, 3); got != 439 {
		t.Errorf("ComputeInstance(3, 3, 3) = %d, want 439", got)
	}
	if got := m.GPUInstance(0, 2); got != -1 {
		t.Errorf("GPUInstance of a malformed line = %d, want -1", got)
	}
	if got := (MIGMinors(nil)).ComputeInstance(0, 0, 0); got != -1 {
		t.Errorf("nil MIGMinors: %d, want -1", got)
	}
}

// The content the mock gives is the driver's numbering: the lines NVIDIA
// quotes from real nodes, one entry per capability of 32 GPUs, 15 GPU
// instances and 8 compute instances each.
func TestDriverMIGMinors(t *testing.T) {
	b := driverMIGMinors()
	m, err := ParseMIGMinors(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 2+32*15*9 {
		t.Errorf("%d capabilities, want %d", len(m), 2+32*15*9)
	}
	for line, minor := range map[string]int{
		// NVIDIA MIG user guide, "Device Nodes and Capabilities".
		"config": 1, "monitor": 2, "gpu0/gi0/access": 3, "gpu0/gi0/ci0/access": 4, "gpu0/gi0/ci1/access": 5,
		"gpu0/gi0/ci2/access": 6, "gpu31/gi14/ci6/access": 4321, "gpu31/gi14/ci7/access": 4322,
		// NVIDIA k8s-dra-driver-gpu, nvlib.go comment.
		"gpu3/gi3/ci3/access": 439, "gpu3/gi3/ci5/access": 441, "gpu6/gi11/ci5/access": 918, "gpu6/gi11/ci7/access": 920,
	} {
		if m[line] != minor {
			t.Errorf("%s = %d, want %d", line, m[line], minor)
		}
	}
}

func TestReadMIGMinors(t *testing.T) {
	dir := t.TempDir()
	if m, err := ReadMIGMinors(filepath.Join(dir, "absent")); err != nil || len(m) != 0 {
		t.Errorf("absent file: %v, %v; want no minors and no error", m, err)
	}
	path := filepath.Join(dir, "mig-minors")
	if err := os.WriteFile(path, []byte("config 1\ngpu0/gi7/access 66\nbroken\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := ReadMIGMinors(path)
	if m.GPUInstance(0, 7) != 66 || err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("ReadMIGMinors = %v, %v; want gi7 66 and an error naming the file and line 3", m, err)
	}
	if _, err := ReadMIGMinors(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("reading a directory: %v, want an error", err)
	}
}
