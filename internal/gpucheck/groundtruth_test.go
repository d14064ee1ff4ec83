package gpucheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/gpu/gputest"
)

func TestParseNvidiaSMI(t *testing.T) {
	out := "GPU-aaaa, 00000000:1B:00.0, 81559, 470\nGPU-bbbb, 00000000:43:00.0, 81559, [N/A]\n\n"
	got, err := ParseNvidiaSMI([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []SMIGPU{{"GPU-aaaa", "00000000:1B:00.0", 81559, 470}, {"GPU-bbbb", "00000000:43:00.0", 81559, -1}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for name, bad := range map[string]string{
		"two fields":    "GPU-a, 00000000:1B:00.0\n",
		"not a uuid":    "0, 00000000:1B:00.0, 81559\n",
		"memory not N":  "GPU-a, 00000000:1B:00.0, [N/A]\n",
		"memory header": "uuid, pci.bus_id, memory.total [MiB]\n",
	} {
		if _, err := ParseNvidiaSMI([]byte(bad)); err == nil {
			t.Errorf("%s: %q parsed", name, bad)
		}
	}
}

func testGPUs() []gpu.GPU {
	return []gpu.GPU{
		{UUID: "GPU-aaaa", Minor: 0, PCIBusID: "00000000:1B:00.0", MemoryBytes: (81559 - 470) << 20},
		{UUID: "GPU-bbbb", Minor: 1, PCIBusID: "00000000:43:00.0", MemoryBytes: 81559 << 20},
	}
}

func TestCompareSMI(t *testing.T) {
	// GPU-aaaa: reserved known, total less reserved published; GPU-bbbb:
	// nvidia-smi does not know the reserved memory, the total published.
	smi := []SMIGPU{{"GPU-aaaa", "00000000:1b:00.0", 81559, 470}, {"GPU-bbbb", "00000000:43:00.0", 81559, -1}}
	if m := CompareSMI(testGPUs(), smi); len(m) != 0 {
		t.Errorf("agreeing views: %v", m)
	}
	for name, tc := range map[string]struct {
		smi  []SMIGPU
		want string
	}{
		"memory": {[]SMIGPU{{"GPU-aaaa", "00000000:1B:00.0", 80000, -1}, smi[1]}, "gpu-0 GPU-aaaa: publishes 81089 MiB, want 80000 MiB from nvidia-smi (80000 MiB total, reserved unknown)"},
		// Discovery must leave the reserved memory out once NVML says
		// how much it is: publishing the total then is a mismatch.
		"total published although reserved known": {[]SMIGPU{smi[0], {"GPU-bbbb", "00000000:43:00.0", 81559, 470}}, "gpu-1 GPU-bbbb: publishes 81559 MiB, want 81089 MiB from nvidia-smi (81559 MiB total less 470 MiB reserved)"},
		"bus":            {[]SMIGPU{{"GPU-aaaa", "00000000:1C:00.0", 81559, 470}, smi[1]}, "bus 00000000:1B:00.0, nvidia-smi says 00000000:1C:00.0"},
		"missing in smi": {smi[:1], "discovery returned gpu-1 GPU-bbbb, nvidia-smi does not list it"},
		"extra in smi":   {append(smi, SMIGPU{"GPU-cccc", "00000000:52:00.0", 81559, 470}), "nvidia-smi lists GPU-cccc"},
	} {
		m := CompareSMI(testGPUs(), tc.smi)
		if len(m) != 1 || !strings.Contains(m[0], tc.want) {
			t.Errorf("%s: mismatches %q, want one containing %q", name, m, tc.want)
		}
	}
}

func writeProc(t *testing.T, dir, bus, uuid string, minor string) {
	t.Helper()
	d := filepath.Join(dir, bus)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	info := "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t " + uuid + "\nBus Type: \t PCIe\nBus Location: \t " + bus + "\nDevice Minor: \t " + minor + "\nGPU Excluded:\t No\n"
	if err := os.WriteFile(filepath.Join(d, "information"), []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadAndCompareProc(t *testing.T) {
	dir := t.TempDir()
	writeProc(t, dir, "0000:1b:00.0", "GPU-aaaa", "0")
	writeProc(t, dir, "0000:43:00.0", "GPU-bbbb", "3")
	proc, err := ReadProcGPUs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(proc) != 2 || proc[1].Minor != 3 || proc[0].Model != "NVIDIA H100 80GB HBM3" {
		t.Fatalf("read %+v", proc)
	}
	m := CompareProc(testGPUs(), proc)
	if len(m) != 1 || !strings.Contains(m[0], "GPU-bbbb: discovery says minor 1, the kernel module 3 (/dev/nvidia3)") {
		t.Errorf("mismatches %q, want the minor of GPU-bbbb", m)
	}
	if _, err := ReadProcGPUs(t.TempDir()); err == nil {
		t.Error("an empty /proc tree read without error")
	}
	writeProc(t, dir, "0000:52:00.0", "GPU-cccc", "not-a-number")
	if _, err := ReadProcGPUs(dir); err == nil || !strings.Contains(err.Error(), "0000:52:00.0/information") {
		t.Errorf("a file without a device minor: %v, want an error naming it", err)
	}
}

// TestMockGroundTruthAgrees: the dry run's fake views of a mock profile
// agree with discovery of that profile, through the same parsers.
func TestMockGroundTruthAgrees(t *testing.T) {
	gpus := gputest.GPUs(t, "hgx-h100")
	dir := t.TempDir()
	if err := WriteMockGroundTruth(dir, gpus); err != nil {
		t.Fatal(err)
	}
	csv, _ := os.ReadFile(filepath.Join(dir, "nvidia-smi.csv"))
	smi, err := ParseNvidiaSMI(csv)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := ReadProcGPUs(filepath.Join(dir, "proc/driver/nvidia/gpus"))
	if err != nil {
		t.Fatal(err)
	}
	if m := append(CompareSMI(gpus, smi), CompareProc(gpus, proc)...); len(m) != 0 || len(smi) != 8 || len(proc) != 8 {
		t.Errorf("%d and %d GPUs, mismatches %v", len(smi), len(proc), m)
	}
}

func TestPoolName(t *testing.T) {
	for host, want := range map[string]string{
		"gpu-node-1":             "gpu-node-1",
		"GPU_Node.Example.COM":   "gpu-node.example.com",
		"":                       DefaultPoolName,
		"_":                      DefaultPoolName,
		"-a..b-":                 "a.b",
		"my host (container) #3": "my-host-container-3",
		strings.Repeat("x", 70):  strings.Repeat("x", 63),
	} {
		if got := PoolName(host); got != want {
			t.Errorf("PoolName(%q) = %q, want %q", host, got, want)
		}
	}
}

func TestComplete(t *testing.T) {
	for name, tc := range map[string]struct {
		checks []Check
		mock   bool
		ok     bool
	}{
		"measured":               {[]Check{{"a", StatusMeasured, "x"}}, false, true},
		"skipped with reason":    {[]Check{{"a", StatusSkipped, "no MPS"}}, false, true},
		"skipped without reason": {[]Check{{"a", StatusSkipped, " "}}, false, false},
		// A check this version does not do is not an outcome, whatever
		// its detail says.
		"not implemented, said":   {[]Check{{"a", "not implemented in this version", "why"}}, false, false},
		"no outcome":              {[]Check{{"a", "", ""}}, false, false},
		"mismatch":                {[]Check{{"a", StatusMismatch, "x"}}, false, false},
		"error":                   {[]Check{{"a", StatusError, "x"}}, false, false},
		"simulated on a real GPU": {[]Check{{"a", StatusSimulated, "x"}}, false, false},
		"measured in a mock run":  {[]Check{{"a", StatusMeasured, "x"}}, true, false},
		"simulated in a mock run": {[]Check{{"a", StatusSimulated, "x"}}, true, true},
	} {
		if ok, bad := Complete(tc.checks, tc.mock); ok != tc.ok {
			t.Errorf("%s: complete %v (%v), want %v", name, ok, bad, tc.ok)
		}
	}
}
