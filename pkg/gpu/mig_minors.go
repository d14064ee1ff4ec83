package gpu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// MIG capability minors.
//
// A process reaches a MIG device through capability device nodes
// /dev/nvidia-caps/nvidia-cap<minor>: one for its GPU instance and one for its
// compute instance. The driver lists the minor of every capability it can
// ever create in /proc/driver/nvidia-caps/mig-minors, one per line, as
// "<capability> <minor>":
//
//	config 1
//	monitor 2
//	gpu0/gi0/access 3
//	gpu0/gi0/ci0/access 4
//	...
//	gpu31/gi14/ci7/access 4322
//
// where gpu<N> is the GPU's device minor (not its NVML index), gi the GPU
// instance ID and ci the compute instance ID (NVIDIA MIG user guide, "Device
// Nodes and Capabilities"; the same format is parsed by NVIDIA's
// container toolkit, internal/nvcaps). The minors are fixed, not allocated as
// instances appear: the file lists every possible capability whether or not
// the instance exists.

// MIGMinorsPath is where the NVIDIA kernel module publishes the MIG
// capability minors.
const MIGMinorsPath = "/proc/driver/nvidia-caps/mig-minors"

// MIGMinors maps MIG capabilities ("config", "monitor",
// "gpu<minor>/gi<id>/access", "gpu<minor>/gi<id>/ci<id>/access") to the minor
// of their /dev/nvidia-caps/nvidia-cap<minor> node. The zero value knows no
// minor.
type MIGMinors map[string]int

// GPUInstance is the minor of GPU instance gi's access capability on the GPU
// with device minor gpuMinor; -1 when unknown.
func (m MIGMinors) GPUInstance(gpuMinor, gi int) int {
	return m.lookup(fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi))
}

// ComputeInstance is the minor of compute instance ci's access capability in
// GPU instance gi of the GPU with device minor gpuMinor; -1 when unknown.
func (m MIGMinors) ComputeInstance(gpuMinor, gi, ci int) int {
	return m.lookup(fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci))
}

func (m MIGMinors) lookup(capability string) int {
	if minor, ok := m[capability]; ok {
		return minor
	}
	return -1
}

// ParseMIGMinors reads mig-minors content. A malformed line (not
// "<capability> <minor>" with a capability of the forms above and a
// non-negative decimal minor) is left out and reported in the returned
// error, which names its line number; the lines around it are still read. A
// capability listed twice keeps its first minor and is reported. Blank lines
// are ignored. The error of the reader itself ends parsing.
func ParseMIGMinors(r io.Reader) (MIGMinors, error) {
	m := MIGMinors{}
	var errs []error
	s := bufio.NewScanner(r)
	for n := 1; s.Scan(); n++ {
		line := strings.TrimSpace(s.Text())
		if line == "" {
			continue
		}
		capability, minor, err := parseMIGMinorsLine(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("mig-minors line %d %q: %w", n, line, err))
			continue
		}
		if first, dup := m[capability]; dup {
			errs = append(errs, fmt.Errorf("mig-minors line %d %q: %s already has minor %d", n, line, capability, first))
			continue
		}
		m[capability] = minor
	}
	if err := s.Err(); err != nil {
		errs = append(errs, fmt.Errorf("reading mig-minors: %w", err))
	}
	return m, errors.Join(errs...)
}

func parseMIGMinorsLine(line string) (string, int, error) {
	fields := strings.Fields(line)
	if len(fields) != 2 {
		return "", 0, errors.New(`want "<capability> <minor>"`)
	}
	capability := fields[0]
	if !validMIGCapability(capability) {
		return "", 0, fmt.Errorf("unknown capability %q", capability)
	}
	minor, err := strconv.Atoi(fields[1])
	if err != nil || minor < 0 || fields[1] != strconv.Itoa(minor) {
		return "", 0, fmt.Errorf("minor %q is not a non-negative decimal number", fields[1])
	}
	return capability, minor, nil
}

// validMIGCapability accepts config, monitor, gpu<N>/gi<N>/access and
// gpu<N>/gi<N>/ci<N>/access with decimal N written without sign or leading
// zeros.
func validMIGCapability(c string) bool {
	if c == "config" || c == "monitor" {
		return true
	}
	parts := strings.Split(c, "/")
	if len(parts) != 3 && len(parts) != 4 || parts[len(parts)-1] != "access" {
		return false
	}
	prefixes := []string{"gpu", "gi", "ci"}
	for i, p := range parts[:len(parts)-1] {
		n, ok := strings.CutPrefix(p, prefixes[i])
		if !ok {
			return false
		}
		if v, err := strconv.Atoi(n); err != nil || v < 0 || n != strconv.Itoa(v) {
			return false
		}
	}
	return true
}

// ReadMIGMinors reads and parses the mig-minors file at path (MIGMinorsPath
// when empty). A file that does not exist gives no minors and no error: the
// node has no MIG-capable driver. Malformed lines are reported as by
// ParseMIGMinors, with the minors of the other lines.
func ReadMIGMinors(path string) (MIGMinors, error) {
	if path == "" {
		path = MIGMinorsPath
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return MIGMinors{}, nil
	}
	if err != nil {
		return MIGMinors{}, err
	}
	m, err := ParseMIGMinors(bytes.NewReader(b))
	if err != nil {
		return m, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Minor numbering of the driver's mig-minors file: config 1, monitor 2, then
// for every GPU minor 0..31 and every GPU instance ID 0..14 the GPU
// instance's access capability followed by those of compute instances 0..7.
// Checked against the file's lines quoted in NVIDIA's MIG user guide
// (gpu0/gi0/access 3, gpu0/gi0/ci0/access 4, gpu31/gi14/ci7/access 4322)
// and those quoted in a comment of NVIDIA's k8s-dra-driver-gpu kubelet
// plugin, nvlib.go (gpu3/gi3/ci3/access 439, gpu6/gi11/ci7/access 920).
const (
	migMinorsGPUs          = 32
	migMinorsGPUInstances  = 15
	migMinorsComputePerGI  = 8
	migMinorsFirstGPUEntry = 3
)

// migMinorGPUInstance and migMinorComputeInstance are the driver's minors.
func migMinorGPUInstance(gpuMinor, gi int) int {
	return migMinorsFirstGPUEntry + gpuMinor*migMinorsGPUInstances*(1+migMinorsComputePerGI) + gi*(1+migMinorsComputePerGI)
}

func migMinorComputeInstance(gpuMinor, gi, ci int) int {
	return migMinorGPUInstance(gpuMinor, gi) + 1 + ci
}

// driverMIGMinors is the mig-minors content the driver writes (see the
// numbering above).
func driverMIGMinors() []byte {
	var b bytes.Buffer
	b.WriteString("config 1\nmonitor 2\n")
	for gpu := range migMinorsGPUs {
		for gi := range migMinorsGPUInstances {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", gpu, gi, migMinorGPUInstance(gpu, gi))
			for ci := range migMinorsComputePerGI {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", gpu, gi, ci, migMinorComputeInstance(gpu, gi, ci))
			}
		}
	}
	return b.Bytes()
}
