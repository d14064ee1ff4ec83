package publish

import (
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
	"github.com/tessera-dev/tessera/pkg/toolkitconfig"
)

// TestUnclaimedAccessTaint: every device of every GPU is published tainted
// while the toolkit's config lets pods without a claim ask for GPUs through
// NVIDIA_VISIBLE_DEVICES (its default), with an event that says why and how
// to fix it; the taint goes once the config is fixed, and neither a node
// without a config nor an admin who allows it gets one.
func TestUnclaimedAccessTaint(t *testing.T) {
	root, proc := t.TempDir(), t.TempDir()
	operatorConfig := filepath.Join(proc, "1/root", toolkitconfig.Paths[1])
	write := func(data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(operatorConfig), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(operatorConfig, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx := ctxFor(t)
	events := &publishtest.Events{}
	access := &UnclaimedAccess{Places: toolkitconfig.Places("", root, proc), Events: events}
	pub := &publishtest.LockedPublisher{}
	inv := &Inventory{NodeName: testNode, Publisher: pub, NodeTaints: access.Taints,
		DiscoverNode: func() (gpu.Discovery, error) { return gpu.Discovery{GPUs: publishtest.GPUs()}, nil }}
	devices := 2 * len(publishtest.GPUs())
	envvar := resourceapi.DeviceTaint{Key: UnclaimedAccessTaintKey, Value: UnclaimedAccessEnvvar, Effect: resourceapi.DeviceTaintEffectNoSchedule}

	// No NVIDIA runtime config: CDI only, nothing to taint, nothing said.
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pub.Taints(); len(got) != 0 {
		t.Errorf("a node without a toolkit config publishes taints %v", got)
	}
	if got := events.List(); len(got) != 0 {
		t.Errorf("a node without a toolkit config gets events %v", got)
	}

	// The GPU Operator's config with the toolkit's defaults.
	write("[nvidia-container-runtime]\nmode = \"auto\"\n")
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("changed %v, err %v; want a publication", changed, err)
	}
	got := pub.Taints()
	if len(got) != devices {
		t.Fatalf("published taints on %d devices (%v), want all %d", len(got), got, devices)
	}
	for dev, taints := range got {
		if len(taints) != 1 || taints[0] != envvar {
			t.Errorf("device %s: taints %v, want [%v]", dev, taints, envvar)
		}
	}
	if !publishtest.HasEvent(events.List(), "Warning GPUsReachableWithoutClaim: ", "/"+toolkitconfig.Paths[1], toolkitconfig.EnvvarSetting+" is not set", "--allow-visible-devices-envvar") {
		t.Errorf("events %q: want a Warning GPUsReachableWithoutClaim naming the file, the setting and the flag", events.List())
	}
	if changed, _ := inv.Sync(ctx); changed || len(events.List()) != 1 {
		t.Errorf("an unchanged verdict: republished %v, events %q", changed, events.List())
	}

	// A config that does not parse: whether it is open is unknown.
	write(toolkitconfig.EnvvarSetting + " = \"false\"\n")
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pub.Taints()["gpu-0"]; len(got) != 1 || got[0].Value != UnclaimedAccessUnknown {
		t.Errorf("unparseable config: gpu-0 taints %v, want %s", got, UnclaimedAccessUnknown)
	}

	// Fixed: the taint goes and an event says so.
	write(toolkitconfig.EnvvarSetting + " = false\n" + toolkitconfig.MountsSetting + " = true\n")
	if changed, err := inv.Sync(ctx); err != nil || !changed {
		t.Fatalf("changed %v, err %v; want a publication", changed, err)
	}
	if got := pub.Taints(); len(got) != 0 {
		t.Errorf("after the fix taints %v", got)
	}
	if !publishtest.HasEvent(events.List(), "Normal GPUsReachableOnlyWithClaim: ") {
		t.Errorf("events %q: want a Normal GPUsReachableOnlyWithClaim", events.List())
	}

	// The admin accepts the risk: no taint, but a warning.
	write("")
	access.Allow = true
	if _, err := inv.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pub.Taints(); len(got) != 0 {
		t.Errorf("allowed: taints %v", got)
	}
	if !publishtest.HasEvent(events.List(), "Warning GPUsReachableWithoutClaimAllowed: ", "published untainted") {
		t.Errorf("events %q: want a Warning GPUsReachableWithoutClaimAllowed", events.List())
	}
}
