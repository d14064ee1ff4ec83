package v1alpha1

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func mpsAttestation() *GpuAttestation {
	return &GpuAttestation{
		Node: "node-1", UUID: "GPU-1", Isolation: IsolationMPS,
		Memory: 20 << 30, Cores: 25, MemoryLimit: 16 << 30, CoresLimit: 50,
		Enforced: &EnforcedLimits{Memory: true, Cores: true},
		Backend: &BackendAttestation{
			Env:       []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"},
			Mounts:    []AttestedMount{{HostPath: "/var/lib/tessera/mps/GPU-1/pipe", ContainerPath: "/tmp/nvidia-mps", ReadOnly: true}},
			Hooks:     []AttestedHook{{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "x"}}},
			MPSDaemon: &MPSDaemonAttestation{GPU: "GPU-1", PipeDirectory: "/var/lib/tessera/mps/GPU-1/pipe"},
		},
	}
}

// TestAttestationRoundTrip: what Encode writes, both decoders read back
// unchanged, with apiVersion and kind set.
func TestAttestationRoundTrip(t *testing.T) {
	for name, a := range map[string]*GpuAttestation{
		"MPS share":    mpsAttestation(),
		"whole GPU":    {Node: "node-1", UUID: "GPU-2"},
		"admin access": {Node: "node-1", UUID: "GPU-2", AdminAccess: true},
		"Advisory share": {Node: "node-1", UUID: "GPU-3", Isolation: IsolationAdvisory, Memory: 1 << 30, CoresLimit: 100,
			MemoryLimit: 1 << 30, Enforced: &EnforcedLimits{}},
	} {
		raw, err := a.Encode()
		if err != nil {
			t.Fatalf("%s: Encode: %v", name, err)
		}
		if !strings.HasPrefix(string(raw), `{"kind":"GpuAttestation","apiVersion":"gpu.tessera.dev/v1alpha1",`) {
			t.Errorf("%s: encoded %s, want kind and apiVersion first", name, raw)
		}
		for decoder, decode := range map[string]func([]byte) (*GpuAttestation, error){
			"strict": DecodeAttestationStrict, "lenient": DecodeAttestationLenient,
		} {
			got, err := decode(raw)
			if err != nil {
				t.Fatalf("%s: %s decode of %s: %v", name, decoder, raw, err)
			}
			if diff := cmp.Diff(a, got); diff != "" {
				t.Errorf("%s: %s round trip (-want +got):\n%s", name, decoder, diff)
			}
		}
	}
}

// TestAttestationDecodeErrors: strict decoding names the field; lenient
// decoding ignores unknown fields and reads the data of earlier plugins
// (no apiVersion and kind), but no other kind.
func TestAttestationDecodeErrors(t *testing.T) {
	head := `"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuAttestation",`
	for name, tc := range map[string]struct {
		raw               string
		strict, lenient   string // error substrings; "" for success
		lenientIsolation  Isolation
		lenientCoresLimit int64
	}{
		"unknown field": {raw: `{` + head + `"uuid":"GPU-1","backend":{"envv":[]}}`,
			strict: "backend.envv: unknown field"},
		"wrong case": {raw: `{` + head + `"UUID":"GPU-1"}`, strict: "UUID: unknown field"},
		"duplicate":  {raw: `{` + head + `"uuid":"GPU-1","uuid":"GPU-2"}`, strict: "uuid: duplicate field"},
		"wrong type": {raw: `{` + head + `"coresLimit":"25"}`, strict: "coresLimit: must be an integer",
			lenient: "coresLimit: must be an integer"},
		"not an object": {raw: `[1]`, strict: "must be an object", lenient: "must be an object"},
		"empty":         {raw: ``, strict: "empty data", lenient: "empty data"},
		"other kind": {raw: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig"}`,
			strict: `kind "GpuConfig" is not supported`, lenient: `kind "GpuConfig" is not supported`},
		"other version": {raw: `{"apiVersion":"gpu.tessera.dev/v2","kind":"GpuAttestation"}`,
			strict: `apiVersion "gpu.tessera.dev/v2" is not supported`, lenient: `apiVersion "gpu.tessera.dev/v2" is not supported`},
		"earlier plugin's data": {raw: `{"uuid":"GPU-1","memoryLimit":1073741824,"coresLimit":25,"isolation":"MPS"}`,
			strict: `apiVersion "" is not supported`, lenientIsolation: IsolationMPS, lenientCoresLimit: 25},
	} {
		_, err := DecodeAttestationStrict([]byte(tc.raw))
		if tc.strict == "" && err != nil || tc.strict != "" && (err == nil || !strings.Contains(err.Error(), tc.strict)) {
			t.Errorf("%s: strict: %v, want %q", name, err, tc.strict)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "invalid GpuAttestation: ") {
			t.Errorf("%s: strict error %q does not start with invalid GpuAttestation", name, err)
		}
		a, err := DecodeAttestationLenient([]byte(tc.raw))
		if tc.lenient == "" && err != nil || tc.lenient != "" && (err == nil || !strings.Contains(err.Error(), tc.lenient)) {
			t.Errorf("%s: lenient: %v, want %q", name, err, tc.lenient)
		}
		if err == nil && tc.lenientIsolation != "" && (a.Isolation != tc.lenientIsolation || a.CoresLimit != tc.lenientCoresLimit ||
			a.TypeMeta != (metav1.TypeMeta{APIVersion: "gpu.tessera.dev/v1alpha1", Kind: "GpuAttestation"})) {
			t.Errorf("%s: lenient read %+v", name, a)
		}
	}
}

// TestAttestationValidate: Encode refuses what the plugin must never write.
func TestAttestationValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(a *GpuAttestation)
		want   string
	}{
		"no uuid":                       {func(a *GpuAttestation) { a.UUID = "" }, "uuid: Required"},
		"no node":                       {func(a *GpuAttestation) { a.Node = "" }, "node: Required"},
		"limit above memory":            {func(a *GpuAttestation) { a.MemoryLimit = a.Memory + 1 }, "memoryLimit"},
		"no memory limit":               {func(a *GpuAttestation) { a.MemoryLimit = 0 }, "memoryLimit"},
		"cap over 100":                  {func(a *GpuAttestation) { a.CoresLimit = 101 }, "coresLimit"},
		"cap below cores":               {func(a *GpuAttestation) { a.CoresLimit = 20 }, "cores"},
		"unknown backend":               {func(a *GpuAttestation) { a.Isolation = "Magic"; a.Enforced = &EnforcedLimits{} }, "isolation: Unsupported"},
		"enforcement the backend lacks": {func(a *GpuAttestation) { a.Isolation = IsolationAdvisory }, "enforced"},
		"share without enforced":        {func(a *GpuAttestation) { a.Enforced = nil }, "enforced: Required"},
		"limits on a whole GPU":         {func(a *GpuAttestation) { a.Isolation = ""; a.Enforced = nil; a.Backend = nil }, "only a share"},
		"isolation with admin access":   {func(a *GpuAttestation) { a.AdminAccess = true }, "adminAccess"},
		"too large": {func(a *GpuAttestation) {
			a.Backend.Env = append(a.Backend.Env, "X="+strings.Repeat("x", MaxAttestationBytes))
		}, "more than the 10240"},
	} {
		a := mpsAttestation()
		tc.change(a)
		if _, err := a.Encode(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Encode error %v, want %q", name, err, tc.want)
		}
	}
}

// TestAttestationString: what the Ready condition and `tessera status` say.
func TestAttestationString(t *testing.T) {
	advisory := mpsAttestation()
	advisory.Isolation, advisory.Enforced = IsolationAdvisory, &EnforcedLimits{}
	memoryOnly := mpsAttestation()
	memoryOnly.Enforced = &EnforcedLimits{Memory: true}
	for want, a := range map[string]*GpuAttestation{
		"MPS enforces memory 16Gi and compute 50% (GPU GPU-1)":            mpsAttestation(),
		"Advisory, not enforced: memory 16Gi and compute 50% (GPU GPU-1)": advisory,
		"MPS enforces memory 16Gi; compute 50% not enforced (GPU GPU-1)":  memoryOnly,
		"whole GPU (GPU GPU-2)":    {UUID: "GPU-2"},
		"admin access (GPU GPU-2)": {UUID: "GPU-2", AdminAccess: true},
	} {
		if got := a.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
	if got := Enforces(IsolationAdvisory); got != (EnforcedLimits{}) {
		t.Errorf("Advisory enforces %+v", got)
	}
}
