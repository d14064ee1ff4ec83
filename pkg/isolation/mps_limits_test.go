package isolation

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestMPSAcquireLimited: the first share of a (GPU, namespace) writes its
// clients' memory limit into the daemon's log directory before the daemon
// starts (the daemon makes it its default, with 100 % of the threads);
// another share of the same memory joins, whatever its cores; one of
// another memory in the same namespace on the GPU is refused with both
// sizes named, while the same size elsewhere, or once the daemon's last
// share is gone, is not. The limits are those the client's variables carry.
func TestMPSAcquireLimited(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	runner := NewFakeRunner()
	m := NewMPSWith(root, runner, MPSOptions{ServerReserve: 512 << 20})
	const gpu = "GPU-aaaa"
	small := GPU{UUID: gpu, Shared: true, MemoryLimit: 4 << 30, CoresLimit: 25}
	big := GPU{UUID: gpu, Shared: true, MemoryLimit: 8 << 30, CoresLimit: 50}
	limitsOf := func(g GPU, domain string) MPSLimits {
		t.Helper()
		l, err := MPSClientLimits(g, m.Daemon(gpu, domain))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := limitsOf(small, "team-a"); l != (MPSLimits{PinnedMemoryMiB: 3584, ActiveThreadPercentage: 25}) {
		t.Fatalf("limits of a 4 GiB, 25%% share: %v", l)
	}
	// The client's own variables say the same.
	edits, err := mpsEdits(small, m.Daemon(gpu, "team-a"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3584M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"} {
		if !strings.Contains(strings.Join(edits.Env, " "), want) {
			t.Errorf("client env %v lacks %s", edits.Env, want)
		}
	}

	d, err := m.AcquireLimited(ctx, gpu, "team-a", types.UID("a"), limitsOf(small, "team-a"))
	if err != nil {
		t.Fatal(err)
	}
	daemonOf := func(l MPSLimits) MPSLimits {
		return MPSLimits{PinnedMemoryMiB: l.PinnedMemoryMiB, ActiveThreadPercentage: 100}
	}
	have, ok, err := readLimits(d)
	if err != nil || !ok || have != daemonOf(limitsOf(small, "team-a")) {
		t.Fatalf("daemon's limits file: %v %v %v, want %v", have, ok, err, daemonOf(limitsOf(small, "team-a")))
	}
	if _, err := m.AcquireLimited(ctx, gpu, "team-a", types.UID("b"), limitsOf(small, "team-a")); err != nil {
		t.Errorf("a second share of the same size: %v", err)
	}
	moreCores := small
	moreCores.CoresLimit = 70
	if _, err := m.AcquireLimited(ctx, gpu, "team-a", types.UID("b2"), limitsOf(moreCores, "team-a")); err != nil {
		t.Errorf("a share of the same memory and more cores: %v", err)
	}
	if err := m.Release(ctx, gpu, "team-a", "b2"); err != nil {
		t.Fatal(err)
	}
	_, err = m.AcquireLimited(ctx, gpu, "team-a", types.UID("c"), limitsOf(big, "team-a"))
	if !errors.Is(err, ErrMPSLimitsDiffer) || !strings.Contains(err.Error(), "7680 MiB") || !strings.Contains(err.Error(), "3584 MiB") {
		t.Errorf("a bigger share in the same namespace on the GPU: %v, want ErrMPSLimitsDiffer naming both sizes", err)
	}
	if h := m.DaemonHolders()[DaemonKey{GPU: gpu, Domain: "team-a"}]; len(h) != 2 {
		t.Errorf("holders after the refusal: %v, want a and b", h)
	}
	if _, err := m.AcquireLimited(ctx, gpu, "team-b", types.UID("c"), limitsOf(big, "team-b")); err != nil {
		t.Errorf("a bigger share in another namespace: %v", err)
	}

	// The domain's daemon goes with its last share; the next one is sized
	// by its own first share.
	for _, c := range []types.UID{"a", "b"} {
		if err := m.Release(ctx, gpu, "team-a", c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(d.LogDir, MPSLimitsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("limits file after the daemon's last share: %v", err)
	}
	d, err = m.AcquireLimited(ctx, gpu, "team-a", types.UID("d"), limitsOf(big, "team-a"))
	if err != nil {
		t.Fatal(err)
	}
	if have, _, _ := readLimits(d); have != daemonOf(limitsOf(big, "team-a")) {
		t.Errorf("the next daemon's limits: %v, want %v", have, daemonOf(limitsOf(big, "team-a")))
	}

	// A daemon that an earlier release started (no limits file), restored
	// with its holders: the first share after it writes its limits (the
	// daemon sets them at its next start), the next is checked against them.
	old := m.Daemon(gpu, "team-c")
	if err := m.Restore(ctx, map[DaemonKey][]types.UID{old.Key(): {"e"}, d.Key(): {"d"}, {GPU: gpu, Domain: "team-b"}: {"c"}}, true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.AcquireLimited(ctx, gpu, "team-c", types.UID("f"), limitsOf(small, "team-c")); err != nil {
		t.Errorf("a share on a daemon without limits: %v", err)
	}
	if have, ok, _ := readLimits(old); !ok || have != daemonOf(limitsOf(small, "team-c")) {
		t.Errorf("limits of the earlier release's daemon after a share: %v %v", have, ok)
	}
	if _, err := m.AcquireLimited(ctx, gpu, "team-c", types.UID("h"), limitsOf(big, "team-c")); !errors.Is(err, ErrMPSLimitsDiffer) {
		t.Errorf("a bigger share beside it: %v, want ErrMPSLimitsDiffer", err)
	}
	// A restart keeps the refusal: the file is on the host.
	if _, err := m.AcquireLimited(ctx, gpu, "team-a", types.UID("g"), limitsOf(small, "team-a")); !errors.Is(err, ErrMPSLimitsDiffer) {
		t.Errorf("after a restart, a smaller share beside a bigger one: %v, want ErrMPSLimitsDiffer", err)
	}
}
