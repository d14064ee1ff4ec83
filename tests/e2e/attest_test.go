//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// attestation returns the GpuAttestation the plugin wrote for the claim's
// one device, checking what every prepared device's entry must have: data
// that decodes strictly and validates, and Ready=True whose message says
// what the attestation says.
func attestation(t *testing.T, c *framework.Cluster, ns, claim string) *configapi.GpuAttestation {
	t.Helper()
	got, err := c.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 1 {
		t.Fatalf("claim %s: status.devices %+v, want one entry", claim, got.Status.Devices)
	}
	d := got.Status.Devices[0]
	if d.Data == nil {
		t.Fatalf("claim %s: status.devices[0] has no data", claim)
	}
	a, err := configapi.DecodeAttestationStrict(d.Data.Raw)
	if err != nil {
		t.Fatalf("claim %s: status.devices[0].data: %v", claim, err)
	}
	if errs := a.Validate(); len(errs) > 0 {
		t.Errorf("claim %s: attestation %s: %v", claim, d.Data.Raw, errs)
	}
	ready := meta.FindStatusCondition(d.Conditions, "Ready")
	if ready == nil || ready.Status != metav1.ConditionTrue || !strings.HasSuffix(ready.Message, a.String()) {
		t.Errorf("claim %s: Ready condition %+v, want True saying %q", claim, ready, a.String())
	}
	t.Logf("claim %s: status.devices[0].data %s", claim, d.Data.Raw)
	return a
}

// TestAttestationInClaimStatus: after a share's pod runs, its claim's
// status.devices[].data is a GpuAttestation of what the node applied: the
// node, the allocated GPU, the backend (Advisory from the node's default;
// MPS from the claim's config), what the share holds (its consumedCapacity),
// the limits in force (computeLimit raises the compute cap), whether each is
// enforced, and backend edits that the container did get (its env); for MPS
// the daemon of the share's GPU. `tessera status` shows the same per share.
func TestAttestationInClaimStatus(t *testing.T) {
	cluster := needDriver(t, "shared.gpu.tessera.dev")
	ns := cluster.Namespace(t, "e2e-attest")
	objs := framework.Claim{Name: "advisory", Memory: "6Gi", Cores: "15"}.WithPod()
	objs = append(objs, framework.Claim{Name: "mps", Memory: "10Gi", Cores: "20",
		Config: framework.GpuConfig("sharing: {isolation: MPS, computeLimit: 40}")}.WithPod()...)
	pods := cluster.RunObjects(t, ns, objs...)

	type want struct {
		isolation           configapi.Isolation
		memory, cores       string
		coresLimit          int64
		enforced            configapi.EnforcedLimits
		mustHaveBackendVars []string
	}
	for name, w := range map[string]want{
		"advisory": {isolation: configapi.IsolationAdvisory, memory: "6Gi", cores: "15", coresLimit: 15,
			mustHaveBackendVars: []string{"TF_FORCE_GPU_ALLOW_GROWTH"}},
		"mps": {isolation: configapi.IsolationMPS, memory: "10Gi", cores: "20", coresLimit: 40,
			enforced:            configapi.EnforcedLimits{Memory: true, Cores: true},
			mustHaveBackendVars: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_VISIBLE_DEVICES"}},
	} {
		p := pods[name]
		dev := framework.ClaimOf(t, cluster, p, "gpu")
		a := attestation(t, cluster, ns, name)
		memory := framework.MustInt64(t, framework.BytesOf(w.memory))
		if a.Node != p.Pod.Spec.NodeName || a.UUID != dev.Attribute("uuid") || a.Isolation != w.isolation ||
			a.Memory != memory || a.Cores != framework.MustInt64(t, w.cores) || a.MemoryLimit != memory || a.CoresLimit != w.coresLimit ||
			a.Enforced == nil || *a.Enforced != w.enforced {
			t.Errorf("claim %s: attestation %+v (enforced %+v); want node %s, GPU %s, isolation %s, %s/%s held, limits %d bytes/%d%%, enforced %+v",
				name, a, a.Enforced, p.Pod.Spec.NodeName, dev.Attribute("uuid"), w.isolation, w.memory, w.cores, memory, w.coresLimit, w.enforced)
		}
		// The container prints the variables the attestation can name
		// (NVIDIA_, CUDA_, TESSERA_, TF_FORCE): each must be as attested.
		seen := map[string]bool{}
		if a.Backend == nil {
			t.Fatalf("claim %s: attestation without backend edits", name)
		}
		for _, kv := range a.Backend.Env {
			k, v, _ := strings.Cut(kv, "=")
			seen[k] = true
			printed := false
			for _, prefix := range []string{"NVIDIA_", "CUDA_", "TESSERA_", "TF_FORCE"} {
				printed = printed || strings.HasPrefix(k, prefix)
			}
			if got, ok := p.Env[k]; printed && (!ok || got != v) {
				t.Errorf("claim %s: attested %s; the container has %s=%q (present %v)", name, kv, k, got, ok)
			}
		}
		for _, k := range w.mustHaveBackendVars {
			if !seen[k] {
				t.Errorf("claim %s: attested backend env %q lacks %s", name, a.Backend.Env, k)
			}
		}
		if w.isolation == configapi.IsolationMPS && (a.Backend.MPSDaemon == nil || a.Backend.MPSDaemon.GPU != a.UUID) {
			t.Errorf("claim %s: MPS daemon %+v, want the daemon of GPU %s", name, a.Backend.MPSDaemon, a.UUID)
		}
		// The env limits the container got are the attested ones.
		minor, err := framework.DeviceMinor(dev.Result.Device)
		if err != nil {
			t.Fatal(err)
		}
		framework.WantVars(t, "pod "+name, p.Env, map[string]string{
			framework.GPUVar(minor) + "_MEMORY_LIMIT": fmt.Sprint(a.MemoryLimit),
			framework.GPUVar(minor) + "_CORES_LIMIT":  fmt.Sprint(a.CoresLimit),
		})
	}

	// tessera status: each share's holder carries the attestation (json)
	// and says what enforces it (table).
	kubeconfig := framework.Kubeconfig(t)
	table := framework.RunCLI(t, "status", "--kubeconfig", kubeconfig)
	t.Logf("tessera status:\n%s", table)
	for _, line := range []string{
		ns + "/advisory (claim advisory: 6Gi, 15 cores; Advisory, not enforced: memory 6Gi and compute 15%)",
		ns + "/mps (claim mps: 10Gi, 20 cores; MPS enforces memory 10Gi and compute 40%)",
	} {
		if !strings.Contains(table, line) {
			t.Errorf("tessera status lacks %q", line)
		}
	}
	var st struct {
		Nodes []struct {
			GPUs []struct {
				Holders []struct {
					Namespace, Claim string
					Attestation      *configapi.GpuAttestation
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(framework.RunCLI(t, "status", "--kubeconfig", kubeconfig, "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	found := map[string]configapi.Isolation{}
	for _, n := range st.Nodes {
		for _, g := range n.GPUs {
			for _, h := range g.Holders {
				if h.Namespace == ns && h.Attestation != nil {
					found[h.Claim] = h.Attestation.Isolation
				}
			}
		}
	}
	if found["advisory"] != configapi.IsolationAdvisory || found["mps"] != configapi.IsolationMPS {
		t.Errorf("tessera status -o json: attested isolations %v, want advisory: Advisory, mps: MPS", found)
	}
}

// TestUnavailableBackendFailsClosed: a DriverMemory share on a GPU whose node
// publishes driverMemoryLimits=false is not run under Advisory: the pod does
// not start, the claim's status says Ready=False/PrepareFailed with the
// reason and carries no attestation, a PrepareFailed event names the claim,
// and `tessera status` shows the share as not prepared.
func TestUnavailableBackendFailsClosed(t *testing.T) {
	cluster := needDriver(t, "shared.gpu.tessera.dev")
	slices, err := cluster.DriverSlices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	incapable := false
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["driverMemoryLimits"]; ok && a.BoolValue != nil && !*a.BoolValue {
				incapable = true
			}
		}
	}
	if !incapable {
		t.Skip("no node publishes driverMemoryLimits=false: every node can apply DriverMemory")
	}
	ns := cluster.Namespace(t, "e2e-failclosed")
	cluster.Apply(t, ns, framework.Claim{Name: "dmem", Memory: "4Gi", Cores: "10",
		Selectors: []string{`device.attributes["gpu.tessera.dev"].driverMemoryLimits == false`},
		Config:    framework.GpuConfig("sharing: {isolation: DriverMemory}")}.WithPod()...)

	ctx := context.Background()
	cluster.WantPrepareFailed(ctx, t, ns, "dmem", "dmem", "isolation DriverMemory: this node cannot enforce driver memory limits")
	events, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ResourceClaim,involvedObject.name=dmem"})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range events.Items {
		found = found || e.Reason == "PrepareFailed" && strings.Contains(e.Message, "DriverMemory")
	}
	if !found {
		t.Errorf("no PrepareFailed event on claim dmem naming DriverMemory: %+v", events.Items)
	}
	cluster.WantNoContainerRunning(ctx, t, ns, "dmem")
	table := framework.RunCLI(t, "status", "--kubeconfig", framework.Kubeconfig(t))
	if !strings.Contains(table, ns+"/dmem (claim dmem: 4Gi, 10 cores; not prepared: ") {
		t.Errorf("tessera status does not show dmem as not prepared:\n%s", table)
	}
}
