package gpucheck

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// Discovery against ground truth: what NVML gave the plugin (pkg/gpu) is
// compared with what two other views of the driver say, so a discovery bug
// cannot hide behind the mock it was tested with:
//
//   - nvidia-smi --query-gpu=uuid,pci.bus_id,memory.total,memory.reserved
//     (the driver's own tool, its own NVML calls and rounding);
//   - /proc/driver/nvidia/gpus/<bus>/information (the kernel module: UUID,
//     bus location and the device minor, which names /dev/nvidia<minor>).

// SMIGPU is one line of nvidia-smi's query.
type SMIGPU struct {
	UUID     string `json:"uuid"`
	BusID    string `json:"busID"`
	TotalMiB int64  `json:"totalMiB"`
	// ReservedMiB is -1 when this nvidia-smi does not know the field.
	ReservedMiB int64 `json:"reservedMiB"`
}

// ProcGPU is one /proc/driver/nvidia/gpus/*/information.
type ProcGPU struct {
	UUID  string `json:"uuid"`
	BusID string `json:"busID"`
	Minor int    `json:"minor"`
	Model string `json:"model"`
}

// smiQuery is the query the check runs; smiQueryOld drops memory.reserved,
// which older drivers refuse.
const (
	smiQuery    = "uuid,pci.bus_id,memory.total,memory.reserved"
	smiQueryOld = "uuid,pci.bus_id,memory.total"
)

// ParseNvidiaSMI parses "nvidia-smi --query-gpu=uuid,pci.bus_id,memory.total[,memory.reserved]
// --format=csv,noheader,nounits".
func ParseNvidiaSMI(out []byte) ([]SMIGPU, error) {
	var gpus []SMIGPU
	sc := bufio.NewScanner(bytes.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if len(f) != 3 && len(f) != 4 {
			return nil, fmt.Errorf("nvidia-smi line %d %q: want 3 or 4 comma-separated fields (uuid, pci.bus_id, memory.total[, memory.reserved])", n, line)
		}
		g := SMIGPU{UUID: f[0], BusID: f[1], ReservedMiB: -1}
		if !strings.HasPrefix(g.UUID, "GPU-") {
			return nil, fmt.Errorf("nvidia-smi line %d: uuid %q: want GPU-…", n, g.UUID)
		}
		var err error
		if g.TotalMiB, err = strconv.ParseInt(strings.TrimSuffix(f[2], " MiB"), 10, 64); err != nil || g.TotalMiB <= 0 {
			return nil, fmt.Errorf("nvidia-smi line %d: memory.total %q: want MiB", n, f[2])
		}
		if len(f) == 4 {
			if r, err := strconv.ParseInt(strings.TrimSuffix(f[3], " MiB"), 10, 64); err == nil && r >= 0 {
				g.ReservedMiB = r
			} // "[N/A]": unknown
		}
		gpus = append(gpus, g)
	}
	return gpus, sc.Err()
}

// ReadProcGPUs reads dir/*/information (dir: /proc/driver/nvidia/gpus).
func ReadProcGPUs(dir string) ([]ProcGPU, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*", "information"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no %s/*/information", dir)
	}
	var out []ProcGPU
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		g := ProcGPU{Minor: -1}
		for line := range strings.SplitSeq(string(data), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch strings.TrimSpace(k) {
			case "Model":
				g.Model = v
			case "GPU UUID":
				g.UUID = v
			case "Bus Location":
				g.BusID = v
			case "Device Minor":
				if m, err := strconv.Atoi(v); err == nil {
					g.Minor = m
				}
			}
		}
		if g.UUID == "" || g.BusID == "" || g.Minor < 0 {
			return nil, fmt.Errorf("%s: want GPU UUID, Bus Location and Device Minor (got %+v)", f, g)
		}
		out = append(out, g)
	}
	return out, nil
}

// normalizeBusID spells a PCI address as domain (4 hex digits), bus, device
// and function in lower case: NVML and nvidia-smi write an 8-digit domain,
// the kernel 4 digits.
func normalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return s
	}
	d, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", d, rest)
}

// CompareSMI compares discovered GPUs with nvidia-smi's. A GPU must publish
// what discovery should make of nvidia-smi's figures: the total less the
// reserved memory when nvidia-smi knows memory.reserved, the total when it
// does not (an old driver: "[N/A]", or the query without the column), within
// 1 MiB (nvidia-smi rounds down to MiB). Anything else, a GPU one side lacks
// or a different bus, is a mismatch.
func CompareSMI(gpus []gpu.GPU, smi []SMIGPU) []string {
	var out []string
	byUUID := map[string]gpu.GPU{}
	for _, g := range gpus {
		byUUID[g.UUID] = g
	}
	seen := map[string]bool{}
	for _, s := range smi {
		seen[s.UUID] = true
		g, ok := byUUID[s.UUID]
		if !ok {
			out = append(out, fmt.Sprintf("nvidia-smi lists %s (%s), discovery did not return it", s.UUID, s.BusID))
			continue
		}
		if normalizeBusID(g.PCIBusID) != normalizeBusID(s.BusID) {
			out = append(out, fmt.Sprintf("gpu-%d %s: bus %s, nvidia-smi says %s", g.Minor, g.UUID, g.PCIBusID, s.BusID))
		}
		got := int64(g.MemoryBytes >> 20)
		want, why := s.TotalMiB, fmt.Sprintf("%d MiB total, reserved unknown", s.TotalMiB)
		if s.ReservedMiB >= 0 {
			want, why = s.TotalMiB-s.ReservedMiB, fmt.Sprintf("%d MiB total less %d MiB reserved", s.TotalMiB, s.ReservedMiB)
		}
		if got < want-1 || got > want+1 {
			out = append(out, fmt.Sprintf("gpu-%d %s: publishes %d MiB, want %d MiB from nvidia-smi (%s)", g.Minor, g.UUID, got, want, why))
		}
	}
	for _, g := range gpus {
		if !seen[g.UUID] {
			out = append(out, fmt.Sprintf("discovery returned gpu-%d %s, nvidia-smi does not list it", g.Minor, g.UUID))
		}
	}
	return out
}

// CompareProc compares discovered GPUs with the kernel module's view: same
// UUIDs, and each GPU's bus and device minor.
func CompareProc(gpus []gpu.GPU, proc []ProcGPU) []string {
	var out []string
	byUUID := map[string]ProcGPU{}
	for _, p := range proc {
		byUUID[p.UUID] = p
	}
	for _, g := range gpus {
		p, ok := byUUID[g.UUID]
		if !ok {
			out = append(out, fmt.Sprintf("discovery returned gpu-%d %s, the kernel module does not list it", g.Minor, g.UUID))
			continue
		}
		delete(byUUID, g.UUID)
		if p.Minor != g.Minor {
			out = append(out, fmt.Sprintf("%s: discovery says minor %d, the kernel module %d (/dev/nvidia%d)", g.UUID, g.Minor, p.Minor, p.Minor))
		}
		if normalizeBusID(g.PCIBusID) != normalizeBusID(p.BusID) {
			out = append(out, fmt.Sprintf("gpu-%d %s: bus %s, the kernel module says %s", g.Minor, g.UUID, g.PCIBusID, p.BusID))
		}
	}
	rest := make([]string, 0, len(byUUID))
	for uuid, p := range byUUID {
		rest = append(rest, fmt.Sprintf("the kernel module lists %s (minor %d, %s), discovery did not return it", uuid, p.Minor, p.BusID))
	}
	slices.Sort(rest)
	return append(out, rest...)
}

// runNvidiaSMI runs the query (falling back to the one without
// memory.reserved), bounded by limit.
func runNvidiaSMI(ctx context.Context, binary string, limit time.Duration) ([]byte, error) {
	var last error
	for _, q := range []string{smiQuery, smiQueryOld} {
		c, cancel := context.WithTimeout(ctx, limit)
		cmd := exec.CommandContext(c, binary, "--query-gpu="+q, "--format=csv,noheader,nounits")
		cmd.WaitDelay = time.Second
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		if err == nil {
			return out, nil
		}
		last = fmt.Errorf("%s --query-gpu=%s: %w: %s", binary, q, err, strings.TrimSpace(stderr.String()+" "+string(out)))
	}
	return nil, last
}

// groundTruthChecks runs both comparisons and returns them as checks.
func groundTruthChecks(ctx context.Context, cfg Config, disc gpu.Discovery) []Check {
	smiCheck := Check{Name: "discovery vs nvidia-smi"}
	binary := cfg.NvidiaSMI
	if binary == "" {
		binary = "nvidia-smi"
	}
	if path, err := exec.LookPath(binary); err != nil {
		smiCheck.Status, smiCheck.Detail = StatusSkipped, fmt.Sprintf("%s not found (%v)", binary, err)
	} else if out, err := runNvidiaSMI(ctx, path, 30*time.Second); err != nil {
		smiCheck.Status, smiCheck.Detail = StatusError, err.Error()
	} else if smi, err := ParseNvidiaSMI(out); err != nil {
		smiCheck.Status, smiCheck.Detail = StatusError, err.Error()
	} else {
		smiCheck.verdict(CompareSMI(disc.GPUs, smi), fmt.Sprintf("%d GPU(s): UUIDs, buses and memory agree", len(smi)))
	}
	procCheck := Check{Name: "discovery vs /proc/driver/nvidia"}
	dir := cfg.ProcDriverNVIDIA
	if dir == "" {
		dir = "/proc/driver/nvidia"
	}
	if proc, err := ReadProcGPUs(filepath.Join(dir, "gpus")); err != nil {
		procCheck.Status, procCheck.Detail = StatusError, err.Error()
		if os.IsNotExist(err) || strings.HasPrefix(err.Error(), "no ") {
			procCheck.Status = StatusSkipped
		}
	} else {
		procCheck.verdict(CompareProc(disc.GPUs, proc), fmt.Sprintf("%d GPU(s): UUIDs, buses and device minors agree", len(proc)))
	}
	if cfg.Mock {
		// A mock node's ground truth is a fake nvidia-smi and /proc tree:
		// the comparison ran, but nothing was measured.
		for _, c := range []*Check{&smiCheck, &procCheck} {
			if c.Status == StatusMeasured {
				c.Status = StatusSimulated
			}
		}
	}
	return []Check{smiCheck, procCheck}
}

// WriteMockGroundTruth writes what nvidia-smi's query and the kernel
// module's /proc tree would say about gpus into dir: nvidia-smi.csv and
// proc/driver/nvidia/gpus/<bus>/information (and proc/driver/nvidia/version).
// Only the bundle's dry run uses it, with a fake nvidia-smi that prints
// the CSV.
func WriteMockGroundTruth(dir string, gpus []gpu.GPU) error {
	var csv strings.Builder
	for _, g := range gpus {
		// nvidia-smi's columns: the total, and the reserved memory where
		// discovery read it ("[N/A]" where the driver did not say).
		reserved := "[N/A]"
		total := g.MemoryBytes
		if g.MemoryReservedUnknown == "" && g.MemoryTotalBytes > 0 {
			total, reserved = g.MemoryTotalBytes, fmt.Sprint(g.MemoryReservedBytes>>20)
		}
		fmt.Fprintf(&csv, "%s, %s, %d, %s\n", g.UUID, g.PCIBusID, total>>20, reserved)
		bus := normalizeBusID(g.PCIBusID)
		info := fmt.Sprintf("Model: \t\t %s\nIRQ:   \t\t 0\nGPU UUID: \t %s\nVideo BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n", g.ProductName, g.UUID, bus, g.Minor)
		d := filepath.Join(dir, "proc", "driver", "nvidia", "gpus", bus)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "information"), []byte(info), 0o644); err != nil {
			return err
		}
	}
	version := "NVRM version: NVIDIA UNIX x86_64 Kernel Module  (mock, no driver)\n"
	if len(gpus) > 0 {
		version = fmt.Sprintf("NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  (mock, no driver)\n", gpus[0].DriverVersion)
	}
	if err := os.WriteFile(filepath.Join(dir, "proc", "driver", "nvidia", "version"), []byte(version), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "nvidia-smi.csv"), []byte(csv.String()), 0o644)
}
