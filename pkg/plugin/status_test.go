package plugin

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/isolation"
	"github.com/tessera-dev/tessera/pkg/metrics"
	"github.com/tessera-dev/tessera/pkg/publish/publishtest"
)

// statusEntry is one status.devices entry of the driver, decoded.
type statusEntry struct {
	Device, ShareID string
	Data            *configapi.GpuAttestation
	Conditions      map[string]string // type -> status/reason
	Messages        map[string]string // type -> message
}

// readStatus returns the claim's status.devices entries as the fake API
// server holds them; the data must decode strictly as a GpuAttestation.
func readStatus(t *testing.T, client *fake.Clientset, c *resourceapi.ResourceClaim) []statusEntry {
	t.Helper()
	got, err := client.ResourceV1().ResourceClaims(c.Namespace).Get(ctxFor(t), c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []statusEntry
	for _, d := range got.Status.Devices {
		if d.Driver != "gpu.tessera.dev" || d.Pool != testNode {
			t.Errorf("status entry for driver %q pool %q", d.Driver, d.Pool)
		}
		en := statusEntry{Device: d.Device, Conditions: map[string]string{}, Messages: map[string]string{}}
		if d.ShareID != nil {
			en.ShareID = *d.ShareID
		}
		if d.Data != nil {
			if len(d.Data.Raw) > resourceapi.AllocatedDeviceStatusDataMaxLength {
				t.Errorf("device %s: data is %d bytes, over the API's limit", d.Device, len(d.Data.Raw))
			}
			a, err := configapi.DecodeAttestationStrict(d.Data.Raw)
			if err != nil {
				t.Fatalf("device %s: data %s: %v", d.Device, d.Data.Raw, err)
			}
			if errs := a.Validate(); len(errs) > 0 {
				t.Errorf("device %s: attestation %s: %v", d.Device, d.Data.Raw, errs)
			}
			en.Data = a
		}
		for _, c := range d.Conditions {
			en.Conditions[c.Type] = string(c.Status) + "/" + c.Reason
			en.Messages[c.Type] = c.Message
		}
		out = append(out, en)
	}
	return out
}

func attestationHeader() metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: "GpuAttestation"}
}

// TestClaimStatus: after prepare the claim's status.devices carries one entry
// per device with its GpuAttestation and a Ready condition; NVLink Preferred
// without NVLink prepares and records that.
func TestClaimStatus(t *testing.T) {
	e := newEnv(t)
	shareClaim := newClaim("uid-s1", []result{share("gpu", "gpu-1-shared", "share-1", "20Gi", "25")},
		claimConfig(isolationConfig(configapi.IsolationMPS)))
	pair := newClaim("uid-s2", []result{whole("gpus", "gpu-0"), whole("gpus", "gpu-2")},
		claimConfig(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","topology":{"nvlink":"Preferred"}}`))
	client := fake.NewClientset(shareClaim.DeepCopy(), pair.DeepCopy())
	p := e.start(func(o *Options) { o.Client = client })

	mustPrepare(t, p.Plugin, shareClaim)
	got := readStatus(t, client, shareClaim)
	if len(got) != 1 || got[0].Data == nil || got[0].Data.Backend == nil {
		t.Fatalf("status of share claim: %+v, want one entry with an attestation and its backend", got)
	}
	backend := got[0].Data.Backend
	if backend.MPSDaemon == nil || backend.MPSDaemon.GPU != publishtest.UUID(1) || !strings.HasPrefix(backend.MPSDaemon.PipeDirectory, e.mpsRoot) {
		t.Errorf("MPS daemon %+v, want GPU %s's daemon under %s", backend.MPSDaemon, publishtest.UUID(1), e.mpsRoot)
	}
	got[0].Data.Backend = nil // compared with the spec in TestAttestationIsWhatTheContainerGets
	want := []statusEntry{{
		Device: "gpu-1-shared", ShareID: "share-1",
		Data: &configapi.GpuAttestation{
			TypeMeta: attestationHeader(), Node: testNode, UUID: publishtest.UUID(1), Isolation: configapi.IsolationMPS,
			Memory: 20 << 30, Cores: 25, MemoryLimit: 20 << 30, CoresLimit: 25,
			Enforced: &configapi.EnforcedLimits{Memory: true, Cores: true},
		},
		Conditions: map[string]string{"Ready": "True/Prepared"},
		Messages:   map[string]string{"Ready": "prepared on node node-a: MPS enforces memory 20Gi and compute 25% (GPU " + publishtest.UUID(1) + ")"},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status of share claim (-want +got):\n%s", diff)
	}

	mustPrepare(t, p.Plugin, pair)
	cond := map[string]string{"Ready": "True/Prepared", "NVLinkConnected": "False/DifferentNVLinkDomains"}
	got = readStatus(t, client, pair)
	for i := range got {
		got[i].Messages = nil
	}
	want = []statusEntry{
		{Device: "gpu-0", Data: &configapi.GpuAttestation{TypeMeta: attestationHeader(), Node: testNode, UUID: publishtest.UUID(0)}, Conditions: cond},
		{Device: "gpu-2", Data: &configapi.GpuAttestation{TypeMeta: attestationHeader(), Node: testNode, UUID: publishtest.UUID(2)}, Conditions: cond},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status of NVLink-preferred pair (-want +got):\n%s", diff)
	}

	// The API server refuses the status write: prepare still succeeds (the
	// container runs the same); the failure is only logged.
	client.PrependReactor("patch", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden by test")
	})
	mustPrepare(t, p.Plugin, newClaim("uid-refused", []result{whole("gpu", "gpu-3")}))
}

// TestAttestationIsWhatTheContainerGets: the attestation is computed from
// what the node applied, not from what the claim asked: the node's default
// isolation where no config sets one, limits from consumedCapacity and
// computeLimit, and backend edits that are exactly those the runtime puts
// into the container from the CDI spec written.
func TestAttestationIsWhatTheContainerGets(t *testing.T) {
	computeLimit := func(iso configapi.Isolation, limit int) string {
		s := `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimit":%d%s}}`
		if iso == "" {
			return fmt.Sprintf(s, limit, "")
		}
		return fmt.Sprintf(s, limit, `,"isolation":"`+string(iso)+`"`)
	}
	for name, tc := range map[string]struct {
		nodeDefault configapi.Isolation
		configs     []config
		want        configapi.Isolation
		enforced    configapi.EnforcedLimits
	}{
		"no config: the node's default Advisory": {
			want: configapi.IsolationAdvisory,
		},
		"no isolation in config: the node's default MPS": {
			nodeDefault: configapi.IsolationMPS, configs: []config{claimConfig(computeLimit("", 40))},
			want: configapi.IsolationMPS, enforced: configapi.EnforcedLimits{Memory: true, Cores: true},
		},
		"claim's HAMiCore over the node's MPS": {
			nodeDefault: configapi.IsolationMPS, configs: []config{claimConfig(computeLimit(configapi.IsolationHAMiCore, 40))},
			want: configapi.IsolationHAMiCore, enforced: configapi.EnforcedLimits{Memory: true, Cores: true},
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			c := newClaim("uid-a", []result{share("gpu", "gpu-2-shared", "share-a", "12Gi", "20")}, tc.configs...)
			client := fake.NewClientset(c.DeepCopy())
			p := e.start(func(o *Options) {
				o.Client = client
				o.DefaultIsolation = tc.nodeDefault
				withHAMiCoreClaims(e, o)
			})
			devs := mustPrepare(t, p.Plugin, c)
			got := readStatus(t, client, c)
			if len(got) != 1 || got[0].Data == nil {
				t.Fatalf("status %+v, want one entry with an attestation", got)
			}
			a := got[0].Data
			wantLimit := int64(20)
			if len(tc.configs) > 0 {
				wantLimit = 40
			}
			if a.Isolation != tc.want || a.Enforced == nil || *a.Enforced != tc.enforced ||
				a.Memory != 12<<30 || a.Cores != 20 || a.MemoryLimit != 12<<30 || a.CoresLimit != wantLimit {
				t.Errorf("attestation %+v enforced %+v, want isolation %s enforced %+v, memory 12Gi, cores 20, limits 12Gi/%d%%",
					a, a.Enforced, tc.want, tc.enforced, wantLimit)
			}

			// What the runtime makes of the spec: the attested backend
			// edits are all in the container, and the limits are the
			// ones the container is given.
			spec := inject(t, cdiIDs(devs), e.cdiRoot)
			for _, kv := range a.Backend.Env {
				if !slices.Contains(spec.Process.Env, kv) {
					t.Errorf("attested %s is not in the container's env %q", kv, spec.Process.Env)
				}
			}
			for _, m := range a.Backend.Mounts {
				if !slices.ContainsFunc(spec.Mounts, func(x oci.Mount) bool {
					return x.Source == m.HostPath && x.Destination == m.ContainerPath && slices.Contains(x.Options, "ro") == m.ReadOnly
				}) {
					t.Errorf("attested mount %+v is not in the container's mounts %+v", m, spec.Mounts)
				}
			}
			if len(a.Backend.Env) == 0 {
				t.Error("attestation lists no backend env")
			}
			for _, kv := range []string{
				fmt.Sprintf("%s_MEMORY_LIMIT=%d", isolation.GPUVariable(2), a.MemoryLimit),
				fmt.Sprintf("%s_CORES_LIMIT=%d", isolation.GPUVariable(2), a.CoresLimit),
			} {
				if !slices.Contains(spec.Process.Env, kv) {
					t.Errorf("container env %q lacks %s (the attested limit)", spec.Process.Env, kv)
				}
			}
		})
	}
}

// TestAttestationSumsSharesOfOneGPU: an enforcing backend applies the summed
// limits of a claim's two shares of one GPU (one process limit); the
// attestation of each device says what is in force, and so does the env.
func TestAttestationSumsSharesOfOneGPU(t *testing.T) {
	e := newEnv(t)
	c := newClaim("uid-two", []result{
		share("a", "gpu-1-shared", "share-a", "8Gi", "10"),
		share("b", "gpu-1-shared", "share-b", "4Gi", "15"),
	}, claimConfig(isolationConfig(configapi.IsolationHAMiCore)))
	client := fake.NewClientset(c.DeepCopy())
	p := e.start(func(o *Options) { o.Client = client; withHAMiCoreClaims(e, o) })
	mustPrepare(t, p.Plugin, c)
	got := readStatus(t, client, c)
	if len(got) != 2 {
		t.Fatalf("status %+v, want two entries", got)
	}
	for _, en := range got {
		a := en.Data
		if a == nil || a.Memory != 12<<30 || a.Cores != 25 || a.MemoryLimit != 12<<30 || a.CoresLimit != 25 {
			t.Errorf("device %s share %s: attestation %+v, want the GPU's summed 12Gi/25%%", en.Device, en.ShareID, a)
		}
	}
}

// withHAMiCoreClaims gives HAMi-core its directory for the claims' shared
// regions where the environment does not.
func withHAMiCoreClaims(e *env, o *Options) {
	if o.HAMiCore.ClaimRoot == "" {
		o.HAMiCore.ClaimRoot = filepath.Join(filepath.Dir(e.mpsRoot), "hami-claims")
	}
}

// capableDriverMemory is a node that can enforce driver memory limits.
var capableDriverMemory = isolation.DriverMemory{Capable: true, HookPath: "/usr/bin/nvidia-cdi-hook", DriverRoot: "/"}

// failClosedCases make each enforcing backend unavailable in each way the
// node can lack it. Every isolation but Advisory must have at least one: a
// new backend gets its cases here.
var failClosedCases = map[configapi.Isolation][]struct {
	name string
	// breakNode makes the backend unavailable; reason is in the error.
	breakNode func(e *env, o *Options)
	reason    string
}{
	configapi.IsolationMPS: {
		{"no MPS on the node", func(_ *env, o *Options) { o.MPS = nil }, "isolation MPS is not available on this node"},
		{"daemon does not start", func(e *env, _ *Options) { e.runner.FailStarts(errors.New("nvidia-cuda-mps-control: not found")) },
			"nvidia-cuda-mps-control: not found"},
	},
	configapi.IsolationHAMiCore: {
		{"library missing", func(e *env, o *Options) { o.HAMiCore.Library = e.hamiLib + ".missing" }, "libvgpu.so.missing"},
		{"not configured", func(_ *env, o *Options) { o.HAMiCore.Library = "" }, "--hami-core-library is empty"},
	},
	configapi.IsolationDriverMemory: {
		{"driver too old", func(_ *env, o *Options) {
			o.DriverMemory = isolation.DriverMemory{Reason: "driver 580.65 is older than r615"}
		}, "driver 580.65 is older than r615"},
		{"no hook", func(_ *env, o *Options) { o.DriverMemory.HookPath = "" }, "--nvidia-cdi-hook-path"},
	},
}

// TestBackendUnavailableFailsClosed: a share whose isolation backend cannot
// be applied is not prepared — never prepared under Advisory instead —
// whether the claim or the node's default chose the backend: the kubelet
// gets the error, no CDI spec, checkpoint entry or MPS hold is left, the
// claim's status says Ready=False/PrepareFailed with the reason and no
// attestation, and a PrepareFailed event names the claim. Once the backend
// is there, the same claim prepares with it.
func TestBackendUnavailableFailsClosed(t *testing.T) {
	for _, iso := range configapi.SupportedIsolations {
		if iso != configapi.IsolationAdvisory && len(failClosedCases[iso]) == 0 {
			t.Errorf("isolation %s has no case in failClosedCases: add how a node can lack it", iso)
		}
	}
	for iso, cases := range failClosedCases {
		for _, tc := range cases {
			for _, chosenBy := range []string{"claim", "node default"} {
				t.Run(string(iso)+"/"+tc.name+"/"+chosenBy, func(t *testing.T) {
					e := newEnv(t)
					var configs []config
					if chosenBy == "claim" {
						configs = append(configs, claimConfig(isolationConfig(iso)))
					}
					c := newClaim("uid-f", []result{share("gpu", "gpu-1-shared", "share-1", "8Gi", "10")}, configs...)
					client := fake.NewClientset(c.DeepCopy())
					// opts is a node on which every backend is available.
					opts := func(o *Options) {
						o.Client = client
						withHAMiCoreClaims(e, o)
						o.DriverMemory = capableDriverMemory
						if chosenBy == "node default" {
							o.DefaultIsolation = iso
						}
					}
					broken := e.start(func(o *Options) { opts(o); tc.breakNode(e, o) })
					r := prepare(t, broken.Plugin, c)
					if r.Err == nil || !strings.Contains(r.Err.Error(), tc.reason) {
						t.Fatalf("prepare: err %v, devices %v; want an error naming %q", r.Err, r.Devices, tc.reason)
					}
					if len(r.Devices) != 0 {
						t.Errorf("failed prepare returned devices %v", r.Devices)
					}
					if broken.opts.MPS == nil {
						// assertClean asks the MPS holders too.
						broken.opts.MPS = isolation.NewMPS(e.mpsRoot, e.runner)
					}
					e.assertClean(broken)
					got := readStatus(t, client, c)
					if len(got) != 1 || got[0].Conditions["Ready"] != "False/PrepareFailed" || got[0].Data != nil ||
						!strings.Contains(got[0].Messages["Ready"], tc.reason) {
						t.Errorf("status %+v, want one entry Ready=False/PrepareFailed naming %q, without attestation", got, tc.reason)
					}
					wantEvent := "claim default/claim-uid-f: Warning PrepareFailed: "
					if !slices.ContainsFunc(e.events.List(), func(ev string) bool {
						return strings.HasPrefix(ev, wantEvent) && strings.Contains(ev, tc.reason)
					}) {
						t.Errorf("events %q, want %s… naming %q", e.events.List(), wantEvent, tc.reason)
					}

					// The backend comes back (another plugin start with it):
					// the claim prepares, attested with that backend.
					e.runner.FailStarts(nil)
					fixed := e.start(opts)
					mustPrepare(t, fixed.Plugin, c)
					got = readStatus(t, client, c)
					if len(got) != 1 || got[0].Conditions["Ready"] != "True/Prepared" || got[0].Data == nil ||
						got[0].Data.Isolation != iso || *got[0].Data.Enforced != configapi.Enforces(iso) {
						t.Errorf("status after the backend came back: %+v, want Ready with isolation %s", got, iso)
					}
				})
			}
		}
	}
}

// TestStatusWriteErrorsCounted: a status write the API server refuses is
// counted in tessera_claim_status_write_errors_total.
func TestStatusWriteErrorsCounted(t *testing.T) {
	e := newEnv(t)
	c := newClaim("uid-w", []result{whole("gpu", "gpu-0")})
	client := fake.NewClientset(c.DeepCopy())
	client.PrependReactor("patch", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden by test")
	})
	m := metrics.New(testNode)
	p := e.start(func(o *Options) { o.Client = client; o.Metrics = m })
	mustPrepare(t, p.Plugin, c)
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() == "tessera_claim_status_write_errors_total" {
			n = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if n != 1 {
		t.Errorf("tessera_claim_status_write_errors_total = %v, want 1", n)
	}
}
