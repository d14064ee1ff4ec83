//go:build e2e

package framework

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// containerEnv is what the named container of p printed.
func ContainerEnvOf(t *testing.T, p SpecPod, name string) map[string]string {
	t.Helper()
	c, ok := p.Container(name)
	if !ok {
		t.Fatalf("pod %s has no container %s that printed its env", p.Pod.Name, name)
	}
	return c.Env
}

// DistinctGPUs fails the test unless the devices are on different GPUs
// (the test's premise: otherwise "exactly its GPUs" cannot tell them apart).
func DistinctGPUs(t *testing.T, gpus ...SeenGPU) {
	t.Helper()
	seen := map[int]string{}
	for _, g := range gpus {
		if other, ok := seen[g.Minor]; ok {
			t.Fatalf("%s and %s are on one GPU (minor %d); the test needs them on different GPUs", other, g.Device, g.Minor)
		}
		seen[g.Minor] = g.Device
	}
}

// CheckStatusData checks the plugin's status.devices entries of a claim
// against the allocated devices: one per device, its uuid, limits and
// isolation, and a Ready=True condition. It returns the entries in the order
// the plugin wrote them.
func CheckStatusData(t *testing.T, c *Cluster, ns, claim string, devs []Allocated, memory, cores int64, isolation string) []ClaimDeviceData {
	t.Helper()
	data, err := c.ClaimStatusDevices(context.Background(), ns, claim)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != len(devs) {
		t.Errorf("claim %s: %d status.devices entries of %s, want one per allocated device (%d): %+v", claim, len(data), Driver, len(devs), data)
	}
	uuids := map[string]string{}
	for _, d := range devs {
		uuids[d.Result.Device] = d.Attribute("uuid")
	}
	for _, d := range data {
		if want, ok := uuids[d.Device]; !ok || d.UUID != want {
			t.Errorf("claim %s: status.devices %s data uuid %q; allocated devices and uuids %v", claim, d.Device, d.UUID, uuids)
		}
		if d.MemoryLimit != memory || d.CoresLimit != cores || d.Isolation != isolation {
			t.Errorf("claim %s: status.devices %s data memoryLimit %d coresLimit %d isolation %q, want %d %d %q",
				claim, d.Device, d.MemoryLimit, d.CoresLimit, d.Isolation, memory, cores, isolation)
		}
		ready := false
		for _, cond := range d.Conditions {
			if cond.Type == "Ready" && cond.Status == metav1.ConditionTrue {
				ready = true
			}
			if cond.Type == "NVLinkConnected" && cond.Status != metav1.ConditionTrue {
				t.Errorf("claim %s: device %s: condition NVLinkConnected=%s %s: %s", claim, d.Device, cond.Status, cond.Reason, cond.Message)
			}
		}
		if !ready {
			t.Errorf("claim %s: status.devices %s has no Ready=True condition: %+v", claim, d.Device, d.Conditions)
		}
		t.Logf("claim %s: status.devices %s: uuid %s memoryLimit %d coresLimit %d isolation %q", claim, d.Device, d.UUID, d.MemoryLimit, d.CoresLimit, d.Isolation)
	}
	return data
}

// MustInt64 parses a decimal number (a byte count from bytesOf, a minor).
func MustInt64(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// LogAllocations logs every allocated ResourceClaim of the cluster with
// the Tessera devices it holds, for a placement that went wrong.
func LogAllocations(t *testing.T, c *Cluster) {
	claims, err := c.Client.ResourceV1().ResourceClaims("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Logf("list claims: %v", err)
		return
	}
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		var held []string
		for _, r := range cl.Status.Allocation.Devices.Results {
			held = append(held, fmt.Sprintf("%s/%s %v", r.Pool, r.Device, r.ConsumedCapacity))
		}
		t.Logf("allocated: %s/%s (deleting %v, reserved for %d): %v", cl.Namespace, cl.Name, cl.DeletionTimestamp != nil, len(cl.Status.ReservedFor), held)
	}
}

// BytesOf is a quantity's value in bytes, as the driver prints it.
func BytesOf(q string) string {
	v := resource.MustParse(q)
	return fmt.Sprint(v.Value())
}

// ClaimOf returns the one device allocated to a pod's claim entry podClaim,
// failing the test unless there is exactly one.
func ClaimOf(t *testing.T, c *Cluster, p SpecPod, podClaim string) Allocated {
	t.Helper()
	devs := DevicesOf(t, c, p, podClaim)
	if len(devs) != 1 {
		t.Fatalf("pod %s: claim %q has %d devices allocated, want 1", p.Pod.Name, podClaim, len(devs))
	}
	return devs[0]
}

// DevicesOf returns the devices allocated to a pod's claim entry podClaim.
func DevicesOf(t *testing.T, c *Cluster, p SpecPod, podClaim string) []Allocated {
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

// WantEnv checks that the pod's (first) container saw exactly these values
// (a "" value: the variable must be absent).
func WantEnv(t *testing.T, p SpecPod, want map[string]string) {
	t.Helper()
	WantVars(t, "pod "+p.Pod.Name, p.Env, want)
}

// WantVars is wantEnv for any env; who names the container in messages.
func WantVars(t *testing.T, who string, env map[string]string, want map[string]string) {
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

// SeenGPU is one GPU a container must see: the allocated device, its minor
// and UUID, and for a share its limits.
type SeenGPU struct {
	Device string
	Minor  int
	Uuid   string
	Share  bool
	Memory int64 // bytes
	Cores  int64 // percent
	// enforced: an MPS or HAMiCore share, whose device also sets
	// CUDA_VISIBLE_DEVICES to its UUID (the one GPU CUDA uses).
	Enforced bool
}

// WholeGPU is what a container that references an allocated whole GPU (or
// any device without limits: admin access) sees of it: its UUID, no limits.
func WholeGPU(t *testing.T, dev Allocated) SeenGPU {
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
	return SeenGPU{Device: dev.Result.Device, Minor: minor, Uuid: uuid}
}

// ShareGPU is what a container that references an allocated share sees of
// it: its UUID and these limits (memory a quantity, "19Gi"; cores percent).
func ShareGPU(t *testing.T, dev Allocated, memory string, cores int64) SeenGPU {
	t.Helper()
	g := WholeGPU(t, dev)
	g.Share, g.Memory, g.Cores = true, MustInt64(t, BytesOf(memory)), cores
	return g
}

// EnforcedShareGPU is ShareGPU for a share whose backend enforces its
// limits (MPS, HAMiCore, DriverMemory): its device also sets
// CUDA_VISIBLE_DEVICES to the GPU's UUID.
func EnforcedShareGPU(t *testing.T, dev Allocated, memory string, cores int64) SeenGPU {
	t.Helper()
	g := ShareGPU(t, dev, memory, cores)
	g.Enforced = true
	return g
}

func (g SeenGPU) String() string {
	s := fmt.Sprintf("%s=%s (%s", GPUVar(g.Minor), g.Uuid, g.Device)
	if g.Share {
		s += fmt.Sprintf(", limits %d bytes, %d%%", g.Memory, g.Cores)
	}
	return s + ")"
}

// WantGPUs checks that a container sees exactly these GPUs, as
// pkg/isolation.DeviceEdits gives them: NVIDIA_VISIBLE_DEVICES=void,
// CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA_VISIBLE_DEVICES only for an enforced
// (MPS, HAMiCore) share and then its UUID, one
// TESSERA_GPU_<minor>=<uuid> per GPU and no other; for a share
// TESSERA_GPU_<minor>_MEMORY_LIMIT and _CORES_LIMIT with its limits, for a
// whole GPU neither; and no other TESSERA_* variable. who names the
// container in messages.
func WantGPUs(t *testing.T, who string, env map[string]string, want ...SeenGPU) {
	t.Helper()
	for _, p := range GPUProblems(who, env, want...) {
		t.Error(p)
	}
}

// GPUProblems is what wantGPUs reports.
func GPUProblems(who string, env map[string]string, want ...SeenGPU) []string {
	cudaVisible := ""
	for _, g := range want {
		if g.Enforced {
			cudaVisible = g.Uuid
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
		if _, dup := wantUUIDs[g.Minor]; dup {
			out = append(out, fmt.Sprintf("%s: the test wants two GPUs with minor %d (%v)", who, g.Minor, want))
		}
		wantUUIDs[g.Minor] = g.Uuid
		v := GPUVar(g.Minor)
		allowed[v] = true
		if g.Share {
			mem, cores := v+MemoryLimitSuffix, v+CoresLimitSuffix
			allowed[mem], allowed[cores] = true, true
			out = append(out, varProblems(who, env, map[string]string{
				mem:   strconv.FormatInt(g.Memory, 10),
				cores: strconv.FormatInt(g.Cores, 10),
			})...)
		}
	}
	if !maps.Equal(got, wantUUIDs) {
		out = append(out, fmt.Sprintf("%s sees GPUs %s; want exactly %v", who, GPUList(got), want))
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

// GPUList prints VisibleGPUs' result in minor order.
func GPUList(gpus map[int]string) string {
	if len(gpus) == 0 {
		return "[none]"
	}
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(gpus)) {
		parts = append(parts, GPUVar(m)+"="+gpus[m])
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// WantConsumed checks a share's consumedCapacity in the allocation result.
func WantConsumed(t *testing.T, pod string, dev Allocated, want map[string]string) {
	t.Helper()
	for res, w := range want {
		q, ok := dev.Result.ConsumedCapacity[resourceapi.QualifiedName(res)]
		if !ok || q.Cmp(resource.MustParse(w)) != 0 {
			t.Errorf("pod %s: device %s consumedCapacity %s = %v, want %s", pod, dev.Result.Device, res, dev.Result.ConsumedCapacity, w)
		}
	}
}

// NoShareEnv checks that a container with whole GPUs only got none of the
// isolation backends' variables (TF_FORCE_GPU_ALLOW_GROWTH, CUDA_MPS_*,
// HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT); its
// TESSERA_* variables are wantGPUs' to check.
func NoShareEnv(t *testing.T, who string, env map[string]string) {
	t.Helper()
	for k, v := range env {
		if strings.HasPrefix(k, "CUDA_MPS_") || strings.HasPrefix(k, "CUDA_DEVICE_MEMORY_LIMIT") ||
			k == "CUDA_DEVICE_SM_LIMIT" || k == "TF_FORCE_GPU_ALLOW_GROWTH" {
			t.Errorf("%s has whole GPUs only but saw %s=%s", who, k, v)
		}
	}
}
