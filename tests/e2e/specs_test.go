//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// specPath returns the path of a demo spec users copy (demo/specs).
func specPath(name string) string {
	return filepath.Join(repoRoot, "demo", "specs", name)
}

// bytesOf is a quantity's value in bytes, as the driver prints it.
func bytesOf(q string) string {
	v := resource.MustParse(q)
	return fmt.Sprint(v.Value())
}

// claimOf returns the one device allocated to a pod's claim entry podClaim,
// failing the test unless there is exactly one.
func claimOf(t *testing.T, c *Cluster, p SpecPod, podClaim string) Allocated {
	t.Helper()
	devs := devicesOf(t, c, p, podClaim)
	if len(devs) != 1 {
		t.Fatalf("pod %s: claim %q has %d devices allocated, want 1", p.Pod.Name, podClaim, len(devs))
	}
	return devs[0]
}

// devicesOf returns the devices allocated to a pod's claim entry podClaim.
func devicesOf(t *testing.T, c *Cluster, p SpecPod, podClaim string) []Allocated {
	t.Helper()
	name, err := PodClaimName(p.Pod, podClaim)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := c.AllocatedDevices(context.Background(), p.Pod.Namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

// wantEnv checks that the pod's (first) container saw exactly these values
// (a "" value: the variable must be absent).
func wantEnv(t *testing.T, p SpecPod, want map[string]string) {
	t.Helper()
	wantVars(t, "pod "+p.Pod.Name, p.Env, want)
}

// wantVars is wantEnv for any env; who names the container in messages.
func wantVars(t *testing.T, who string, env map[string]string, want map[string]string) {
	t.Helper()
	for _, p := range varProblems(who, env, want) {
		t.Error(p)
	}
}

// varProblems is what wantVars reports.
func varProblems(who string, env map[string]string, want map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		got, ok := env[k]
		switch {
		case want[k] == "" && ok:
			out = append(out, fmt.Sprintf("%s: %s=%s is set; want it absent", who, k, got))
		case want[k] != "" && got != want[k]:
			out = append(out, fmt.Sprintf("%s: %s = %q, want %q", who, k, got, want[k]))
		}
	}
	return out
}

// seenGPU is one GPU a container must see: the allocated device, its minor
// and UUID, and for a share its limits.
type seenGPU struct {
	device string
	minor  int
	uuid   string
	share  bool
	memory int64 // bytes
	cores  int64 // percent
	// enforced: an MPS or HAMiCore share, whose device also sets
	// CUDA_VISIBLE_DEVICES to its UUID (the one GPU CUDA uses).
	enforced bool
}

// wholeGPU is what a container that references an allocated whole GPU (or
// any device without limits: admin access) sees of it: its UUID, no limits.
func wholeGPU(t *testing.T, dev Allocated) seenGPU {
	t.Helper()
	minor, err := DeviceMinor(dev.Result.Device)
	if err != nil {
		t.Fatal(err)
	}
	if m := dev.Attribute("minor"); m != "" && m != strconv.Itoa(minor) {
		t.Errorf("device %s has attribute minor %s", dev.Result.Device, m)
	}
	uuid := dev.Attribute("uuid")
	if uuid == "" {
		t.Fatalf("allocated device %s advertises no uuid", dev.Result.Device)
	}
	return seenGPU{device: dev.Result.Device, minor: minor, uuid: uuid}
}

// shareGPU is what a container that references an allocated share sees of
// it: its UUID and these limits (memory a quantity, "19Gi"; cores percent).
func shareGPU(t *testing.T, dev Allocated, memory string, cores int64) seenGPU {
	t.Helper()
	g := wholeGPU(t, dev)
	g.share, g.memory, g.cores = true, mustInt64(t, bytesOf(memory)), cores
	return g
}

func (g seenGPU) String() string {
	s := fmt.Sprintf("%s=%s (%s", GPUVar(g.minor), g.uuid, g.device)
	if g.share {
		s += fmt.Sprintf(", limits %d bytes, %d%%", g.memory, g.cores)
	}
	return s + ")"
}

// wantGPUs checks that a container sees exactly these GPUs, as
// pkg/isolation.DeviceEdits gives them: NVIDIA_VISIBLE_DEVICES=void,
// CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA_VISIBLE_DEVICES only for an enforced
// (MPS, HAMiCore) share and then its UUID, one
// TESSERA_GPU_<minor>=<uuid> per GPU and no other; for a share
// TESSERA_GPU_<minor>_MEMORY_LIMIT and _CORES_LIMIT with its limits, for a
// whole GPU neither; and no other TESSERA_* variable. who names the
// container in messages.
func wantGPUs(t *testing.T, who string, env map[string]string, want ...seenGPU) {
	t.Helper()
	for _, p := range gpuProblems(who, env, want...) {
		t.Error(p)
	}
}

// gpuProblems is what wantGPUs reports.
func gpuProblems(who string, env map[string]string, want ...seenGPU) []string {
	cudaVisible := ""
	for _, g := range want {
		if g.enforced {
			cudaVisible = g.uuid
		}
	}
	out := varProblems(who, env, map[string]string{
		"NVIDIA_VISIBLE_DEVICES": "void",
		"CUDA_DEVICE_ORDER":      "PCI_BUS_ID",
		"CUDA_VISIBLE_DEVICES":   cudaVisible,
	})
	got, err := VisibleGPUs(env)
	if err != nil {
		out = append(out, fmt.Sprintf("%s: %v", who, err))
	}
	wantUUIDs := map[int]string{}
	allowed := map[string]bool{}
	for _, g := range want {
		if _, dup := wantUUIDs[g.minor]; dup {
			out = append(out, fmt.Sprintf("%s: the test wants two GPUs with minor %d (%v)", who, g.minor, want))
		}
		wantUUIDs[g.minor] = g.uuid
		v := GPUVar(g.minor)
		allowed[v] = true
		if g.share {
			mem, cores := v+MemoryLimitSuffix, v+CoresLimitSuffix
			allowed[mem], allowed[cores] = true, true
			out = append(out, varProblems(who, env, map[string]string{
				mem:   strconv.FormatInt(g.memory, 10),
				cores: strconv.FormatInt(g.cores, 10),
			})...)
		}
	}
	if !maps.Equal(got, wantUUIDs) {
		out = append(out, fmt.Sprintf("%s sees GPUs %s; want exactly %v", who, gpuList(got), want))
	}
	var extra []string
	for k, v := range env {
		if strings.HasPrefix(k, "TESSERA_") && !allowed[k] {
			extra = append(extra, k+"="+v)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		out = append(out, fmt.Sprintf("%s sees %s, which belong to no GPU it references (%v)", who, strings.Join(extra, " "), want))
	}
	return out
}

// gpuList prints VisibleGPUs' result in minor order.
func gpuList(gpus map[int]string) string {
	if len(gpus) == 0 {
		return "[none]"
	}
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(gpus)) {
		parts = append(parts, GPUVar(m)+"="+gpus[m])
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// wantConsumed checks a share's consumedCapacity in the allocation result.
func wantConsumed(t *testing.T, pod string, dev Allocated, want map[string]string) {
	t.Helper()
	for res, w := range want {
		q, ok := dev.Result.ConsumedCapacity[resourceapi.QualifiedName(res)]
		if !ok || q.Cmp(resource.MustParse(w)) != 0 {
			t.Errorf("pod %s: device %s consumedCapacity %s = %v, want %s", pod, dev.Result.Device, res, dev.Result.ConsumedCapacity, w)
		}
	}
}

// noShareEnv checks that a container with whole GPUs only got none of the
// isolation backends' variables (TF_FORCE_GPU_ALLOW_GROWTH, CUDA_MPS_*,
// HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT); its
// TESSERA_* variables are wantGPUs' to check.
func noShareEnv(t *testing.T, who string, env map[string]string) {
	t.Helper()
	for k, v := range env {
		if strings.HasPrefix(k, "CUDA_MPS_") || strings.HasPrefix(k, "CUDA_DEVICE_MEMORY_LIMIT") ||
			k == "CUDA_DEVICE_SM_LIMIT" || k == "TF_FORCE_GPU_ALLOW_GROWTH" {
			t.Errorf("%s has whole GPUs only but saw %s=%s", who, k, v)
		}
	}
}

// TestDemoQuarterShares runs demo/specs/10-quarter-gpu-shares.yaml: four pods
// with a quarter of a GPU each share one GPU (first-fit), and each sees that
// GPU (TESSERA_GPU_<minor>=<uuid>) and no other, a 19Gi memory limit and 25%
// of the cores (TESSERA_GPU_<minor>_MEMORY_LIMIT, _CORES_LIMIT; Advisory
// isolation).
func TestDemoQuarterShares(t *testing.T) {
	cluster := needCluster(t)
	cluster.RequireDriver(t, "shared.gpu.tessera.dev")
	// As in TestFractionHalvesTileTheNode: right after earlier tests'
	// claims go, the scheduler's view can still hold one on a loaded
	// two-core machine, and a quarter then lands on a second GPU. One such
	// attempt is retried in a fresh namespace after a longer settle, with
	// every allocation in the cluster logged first.
	var pods map[string]SpecPod
	for attempt := 1; ; attempt++ {
		ns := cluster.Namespace(t, "e2e-quarter")
		pods = cluster.RunSpec(t, ns, specPath("10-quarter-gpu-shares.yaml"))
		if len(pods) != 4 {
			t.Fatalf("%d pods ran, want 4", len(pods))
		}
		on := map[string]bool{}
		for _, p := range pods {
			on[claimOf(t, cluster, p, "gpu").Result.Device] = true
		}
		if len(on) == 1 || attempt == 2 {
			break
		}
		logAllocations(t, cluster)
		t.Logf("attempt %d: the four quarters went to %v; retrying once after a settle", attempt, on)
		cluster.deleteNamespace(t, ns)
		time.Sleep(3 * namespaceSettle)
	}
	devices := map[string]bool{}
	shareIDs := map[string]bool{}
	for name, p := range pods {
		dev := claimOf(t, cluster, p, "gpu")
		devices[dev.Result.Device] = true
		sid := ""
		if dev.Attribute("type") != "shared" || dev.Result.ShareID == nil {
			t.Errorf("pod %s: device %s (type %q, shareID %v), want a share of a shared device", name, dev.Result.Device, dev.Attribute("type"), dev.Result.ShareID)
		} else {
			sid = string(*dev.Result.ShareID)
			shareIDs[sid] = true
		}
		wantConsumed(t, name, dev, map[string]string{"memory": "19Gi", "cores": "25"})
		g := shareGPU(t, dev, "19Gi", 25)
		wantGPUs(t, "pod "+name, p.Env, g)
		wantEnv(t, p, map[string]string{
			"TF_FORCE_GPU_ALLOW_GROWTH": "true",
			"CUDA_MPS_PIPE_DIRECTORY":   "",
		})
		t.Logf("pod %s: device %s, share %s, sees %s", name, dev.Result.Device, sid, g)
	}
	if len(devices) != 1 {
		t.Errorf("the four quarters went to devices %v, want all on one shared device", devices)
	}
	if len(shareIDs) != 4 {
		t.Errorf("share IDs %v, want four distinct shares", shareIDs)
	}
}
