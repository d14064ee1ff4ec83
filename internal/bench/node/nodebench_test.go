package node

import (
	"runtime"
	"testing"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// TestRun checks the shape of a small run: every backend measured with the
// claims asked for, the 8-GPU node published as two slices with one write
// each, nothing written again for an unchanged node, and the report
// surviving the trip through JSON that cmd/tessera-bench makes. Timings are
// not asserted.
func TestRun(t *testing.T) {
	rep, err := Run(t.Context(), Options{Sequential: 5, Concurrent: 16, Rounds: 2, Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rep.GPUs != 8 || rep.Profile != "hgx-h100" {
		t.Errorf("node: %d GPUs of profile %q, want 8 of hgx-h100", rep.GPUs, rep.Profile)
	}
	if len(rep.Backends) != len(configapi.SupportedIsolations) {
		t.Fatalf("backends: got %d, want %d", len(rep.Backends), len(configapi.SupportedIsolations))
	}
	for i, b := range rep.Backends {
		if b.Isolation != configapi.SupportedIsolations[i] {
			t.Errorf("backend %d: %s, want %s", i, b.Isolation, configapi.SupportedIsolations[i])
		}
		if b.Sequential.Claims != 5 || b.Concurrent.Claims != 32 || b.Concurrent.ClaimsPerRound != 16 {
			t.Errorf("%s: %d sequential and %d concurrent claims (%d per round), want 5 and 32 (16)",
				b.Isolation, b.Sequential.Claims, b.Concurrent.Claims, b.Concurrent.ClaimsPerRound)
		}
		for _, l := range []Latency{b.Sequential, b.Concurrent} {
			if !(0 < l.P50 && l.P50 <= l.P99 && l.P99 <= l.Max) {
				t.Errorf("%s: percentiles out of order: %+v", b.Isolation, l)
			}
		}
	}

	w := rep.Writes
	if w.Slices != 2 || w.Publish != (Writes{Create: 2}) {
		t.Errorf("first publish of the 8-GPU node: %d slices, writes %+v; want 2 slices, 2 creates", w.Slices, w.Publish)
	}
	if w.Republish.Total() != 0 || !w.InventorySkipsUnchanged {
		t.Errorf("republishing an unchanged node: writes %+v, inventory skipped it: %v; want no writes, skipped", w.Republish, w.InventorySkipsUnchanged)
	}
	if w.HealthChange != (Writes{Update: 1}) {
		t.Errorf("one GPU turning unhealthy: writes %+v, want one update (the device slice)", w.HealthChange)
	}

	if runtime.GOOS == "linux" {
		m := rep.Memory
		if m.IdleRSS <= 0 || m.IdleHWM < m.IdleRSS || m.LoadPeakRSS <= 0 || m.LoadHWM < m.IdleHWM ||
			m.BaseAnon <= 0 || m.IdleAnon > m.IdleRSS || m.LoadPeakAnon > m.LoadPeakRSS {
			t.Errorf("memory figures inconsistent: %+v", m)
		}
	}

	data, err := rep.JSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseReport(data)
	if err != nil {
		t.Fatal(err)
	}
	if back.Writes != rep.Writes || back.Memory != rep.Memory || len(back.Backends) != len(rep.Backends) || back.Backends[0] != rep.Backends[0] {
		t.Errorf("JSON round trip changed the report:\n%+v\n%+v", rep, back)
	}
}

func TestParseProcStatus(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    procStatus
		wantErr bool
	}{
		{name: "all", in: "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\nRssFile:\t 512 kB\nThreads:\t4\n",
			want: procStatus{RSS: 1 << 20, HWM: 2 << 20, Anon: 512 << 10}},
		{name: "missing", in: "Name:\tx\n", want: procStatus{}},
		{name: "bad unit", in: "VmRSS:\t1024 MB\n", wantErr: true},
		{name: "bad number", in: "VmRSS:\tlots kB\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStatus([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseProcStatus(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}
