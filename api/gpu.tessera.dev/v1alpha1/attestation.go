package v1alpha1

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
)

// GpuAttestationKind is the kind of the data the kubelet plugin writes into
// a claim's status.devices[].data.
const GpuAttestationKind = "GpuAttestation"

// MaxAttestationBytes is the API server's limit on status.devices[].data
// (resource.k8s.io/v1 AllocatedDeviceStatusDataMaxLength).
const MaxAttestationBytes = 10 * 1024

// GpuAttestation is what the kubelet plugin applied to one prepared device of
// a claim, written into the claim's status.devices[].data when the prepare
// succeeded: the GPU, the isolation backend that enforces a share's limits,
// the limits in force and the backend's edits as the CDI spec carries them.
// It is computed from what the node applied (the node's default isolation
// filled in, the limits computed from the allocation's consumedCapacity, the
// edits the backend produced), never copied from the claim's config.
//
// A prepare whose backend cannot be applied fails; no attestation is written
// for it, and the device's Ready condition is False with the reason.
//
// The JSON field names uuid, memoryLimit, coresLimit and isolation are those
// the plugin wrote before the attestation had a kind; DecodeAttestationLenient
// reads that older data too.
type GpuAttestation struct {
	metav1.TypeMeta `json:",inline"`

	// Node is the node whose plugin prepared the device.
	Node string `json:"node"`
	// UUID is the GPU's UUID.
	UUID string `json:"uuid"`
	// AdminAccess is true for a device allocated with admin access: it
	// observes the GPU, holds nothing and has no limits.
	AdminAccess bool `json:"adminAccess,omitempty"`

	// The fields below are set for shares (devices gpu-N-shared) only.

	// Isolation is the backend that applies the share's limits (after the
	// node's --default-isolation filled in what no config chose).
	Isolation Isolation `json:"isolation,omitempty"`
	// Memory (bytes) and Cores (percent) are what the share holds of the GPU:
	// its consumedCapacity, the guarantee the scheduler gave it.
	Memory int64 `json:"memory,omitempty"`
	Cores  int64 `json:"cores,omitempty"`
	// MemoryLimit (bytes) and CoresLimit (percent, the compute cap) are the
	// limits the backend applies to the container's use of the GPU.
	MemoryLimit int64 `json:"memoryLimit,omitempty"`
	CoresLimit  int64 `json:"coresLimit,omitempty"`
	// Enforced says which of the limits the backend enforces; a limit that
	// is not enforced is only advertised to the container (Advisory).
	Enforced *EnforcedLimits `json:"enforced,omitempty"`
	// Backend is what the backend added to the device's CDI edits: the
	// environment, hooks and mounts through which it applies the limits.
	Backend *BackendAttestation `json:"backend,omitempty"`
}

// EnforcedLimits says which limits of a share a backend enforces.
type EnforcedLimits struct {
	Memory bool `json:"memory"`
	Cores  bool `json:"cores"`
}

// BackendAttestation is the isolation backend's part of a share device's CDI
// edits, as written into the claim's CDI spec.
type BackendAttestation struct {
	// Env is the backend's variables, NAME=value.
	Env []string `json:"env,omitempty"`
	// Hooks are the OCI hooks the backend adds (for example the NVIDIA
	// container toolkit's hook that applies driver-enforced memory limits).
	Hooks []AttestedHook `json:"hooks,omitempty"`
	// Mounts are the backend's bind mounts.
	Mounts []AttestedMount `json:"mounts,omitempty"`
	// MPSDaemon is the MPS control daemon the container's clients connect
	// to (MPS only).
	MPSDaemon *MPSDaemonAttestation `json:"mpsDaemon,omitempty"`
}

// AttestedHook is one OCI hook of a backend.
type AttestedHook struct {
	// HookName is the OCI lifecycle point (createContainer, …).
	HookName string   `json:"hookName"`
	Path     string   `json:"path"`
	Args     []string `json:"args,omitempty"`
}

// AttestedMount is one bind mount of a backend.
type AttestedMount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// MPSDaemonAttestation identifies an MPS control daemon.
type MPSDaemonAttestation struct {
	// GPU is the UUID of the GPU the daemon serves.
	GPU string `json:"gpu"`
	// PipeDirectory is the daemon's pipe directory on the host; the
	// container's CUDA_MPS_PIPE_DIRECTORY is a mount of it.
	PipeDirectory string `json:"pipeDirectory"`
	// Name names the daemon's process or pod where its runner knows one.
	Name string `json:"name,omitempty"`
}

// enforcedLimits is, per backend, which limits it enforces. A backend not
// listed (Advisory, or one this table has not learned) enforces nothing:
// the attestation never claims enforcement it cannot vouch for.
var enforcedLimits = map[Isolation]EnforcedLimits{
	// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
	// applied by the MPS server.
	IsolationMPS: {Memory: true, Cores: true},
	// libvgpu.so intercepts allocations and throttles kernel launches.
	IsolationHAMiCore: {Memory: true, Cores: true},
	// The driver's cgroup v2 dmem limit; compute is not limited.
	IsolationDriverMemory: {Memory: true},
}

// Enforces says which limits of a share the isolation backend enforces.
func Enforces(isolation Isolation) EnforcedLimits {
	return enforcedLimits[isolation]
}

// Encode sets apiVersion and kind and returns the attestation as the JSON
// object status.devices[].data holds. It fails when the attestation is
// invalid or longer than MaxAttestationBytes.
func (a *GpuAttestation) Encode() ([]byte, error) {
	a.APIVersion, a.Kind = SchemeGroupVersion.String(), GpuAttestationKind
	if errs := a.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("invalid GpuAttestation: %w", errs.ToAggregate())
	}
	raw, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("encode GpuAttestation: %w", err)
	}
	if len(raw) > MaxAttestationBytes {
		return nil, fmt.Errorf("GpuAttestation is %d bytes, more than the %d status.devices[].data may hold", len(raw), MaxAttestationBytes)
	}
	return raw, nil
}

// Validate checks an attestation as the plugin writes it: apiVersion and
// kind, the GPU's UUID, limits that fit the share (memory limit at most what
// it holds, compute cap 1..100 and at least its cores), an isolation backend
// only for a share.
func (a *GpuAttestation) Validate() field.ErrorList {
	var errs field.ErrorList
	if a.APIVersion != SchemeGroupVersion.String() {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), a.APIVersion, []string{SchemeGroupVersion.String()}))
	}
	if a.Kind != GpuAttestationKind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), a.Kind, []string{GpuAttestationKind}))
	}
	if a.Node == "" {
		errs = append(errs, field.Required(field.NewPath("node"), ""))
	}
	if a.UUID == "" {
		errs = append(errs, field.Required(field.NewPath("uuid"), ""))
	}
	share := a.Isolation != ""
	if !share {
		for name, v := range map[string]int64{"memory": a.Memory, "cores": a.Cores, "memoryLimit": a.MemoryLimit, "coresLimit": a.CoresLimit} {
			if v != 0 {
				errs = append(errs, field.Invalid(field.NewPath(name), v, "only a share (with an isolation) has limits"))
			}
		}
		if a.Enforced != nil || a.Backend != nil {
			errs = append(errs, field.Forbidden(field.NewPath("isolation"), "required with enforced or backend"))
		}
		return errs
	}
	if !slices.Contains(SupportedIsolations, a.Isolation) {
		errs = append(errs, field.NotSupported(field.NewPath("isolation"), a.Isolation, SupportedIsolations))
	}
	if a.AdminAccess {
		errs = append(errs, field.Forbidden(field.NewPath("adminAccess"), "a device with admin access has no isolation"))
	}
	if a.MemoryLimit <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("memoryLimit"), a.MemoryLimit, "must be positive for a share"))
	}
	if a.Memory < 0 || (a.Memory > 0 && a.MemoryLimit > a.Memory) {
		errs = append(errs, field.Invalid(field.NewPath("memoryLimit"), a.MemoryLimit, fmt.Sprintf("must be at most the share's memory (%d)", a.Memory)))
	}
	if a.CoresLimit < 1 || a.CoresLimit > MaxCores {
		errs = append(errs, field.Invalid(field.NewPath("coresLimit"), a.CoresLimit, fmt.Sprintf("must be 1..%d", MaxCores)))
	}
	if a.Cores < 0 || a.Cores > a.CoresLimit {
		errs = append(errs, field.Invalid(field.NewPath("cores"), a.Cores, "must be 0..coresLimit"))
	}
	if a.Enforced == nil {
		errs = append(errs, field.Required(field.NewPath("enforced"), "a share says which of its limits are enforced"))
	} else if want := Enforces(a.Isolation); *a.Enforced != want {
		errs = append(errs, field.Invalid(field.NewPath("enforced"), *a.Enforced,
			fmt.Sprintf("isolation %s enforces memory=%t cores=%t", a.Isolation, want.Memory, want.Cores)))
	}
	return errs
}

// DecodeAttestationStrict decodes a GpuAttestation in JSON as the plugin
// writes it: apiVersion gpu.tessera.dev/v1alpha1 and kind GpuAttestation are
// required; unknown, duplicate and wrongly cased fields are errors naming
// their field path, all reported at once. It neither defaults nor validates.
func DecodeAttestationStrict(raw []byte) (*GpuAttestation, error) {
	return decodeAttestation(raw, true)
}

// DecodeAttestationLenient decodes what this or another version of the plugin
// wrote into status.devices[].data: unknown fields are ignored (a newer
// plugin may add some), and data without apiVersion and kind — written
// before the attestation had a kind, with the same uuid, memoryLimit,
// coresLimit and isolation fields — is read as a GpuAttestation. A different
// apiVersion or kind is an error.
func DecodeAttestationLenient(raw []byte) (*GpuAttestation, error) {
	return decodeAttestation(raw, false)
}

func decodeAttestation(raw []byte, strict bool) (*GpuAttestation, error) {
	invalid := func(problems ...string) error {
		return errors.New("invalid GpuAttestation: " + strings.Join(problems, "; "))
	}
	if len(raw) == 0 {
		return nil, invalid("empty data")
	}
	if len(raw) > MaxConfigBytes {
		return nil, invalid(fmt.Sprintf("the input is %d bytes, more than the %d accepted", len(raw), MaxConfigBytes))
	}
	var a GpuAttestation
	var strictErrs []error
	var err error
	if strict {
		strictErrs, err = sigsjson.UnmarshalStrict(raw, &a, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	} else {
		// Case-sensitive like the strict path; unknown fields are
		// ignored and the last of duplicate fields wins.
		err = sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &a)
	}
	if err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, invalid(describeTypeError(typeErr))
		}
		return nil, invalid("not a JSON object: " + oneLine(err.Error()))
	}
	var problems []string
	for _, e := range strictErrs {
		problems = append(problems, describeStrictError(e)...)
	}
	legacy := !strict && a.APIVersion == "" && a.Kind == ""
	if legacy {
		a.APIVersion, a.Kind = SchemeGroupVersion.String(), GpuAttestationKind
	}
	if a.APIVersion != SchemeGroupVersion.String() {
		problems = append(problems, fmt.Sprintf("apiVersion %q is not supported (supported: %s)", a.APIVersion, SchemeGroupVersion))
	}
	if a.Kind != GpuAttestationKind {
		problems = append(problems, fmt.Sprintf("kind %q is not supported (supported: %s)", a.Kind, GpuAttestationKind))
	}
	if len(problems) > 0 {
		return nil, invalid(problems...)
	}
	return &a, nil
}

// String says in one line what the attestation vouches for, as the Ready
// condition's message shows it: [GpuAttestation.Limits] and the GPU.
//
//	MPS enforces memory 20Gi and compute 25% (GPU GPU-0b8d…)
func (a *GpuAttestation) String() string {
	return a.Limits() + " (GPU " + a.UUID + ")"
}

// Limits says what enforces the device's limits, as `tessera status` shows
// it beside the share:
//
//	whole GPU
//	admin access
//	MPS enforces memory 20Gi and compute 25%
//	DriverMemory enforces memory 20Gi; compute 25% not enforced
//	Advisory, not enforced: memory 20Gi and compute 25%
func (a *GpuAttestation) Limits() string {
	switch {
	case a.AdminAccess:
		return "admin access"
	case a.Isolation == "":
		return "whole GPU"
	}
	memory := "memory " + resource.NewQuantity(a.MemoryLimit, resource.BinarySI).String()
	compute := "compute " + strconv.FormatInt(a.CoresLimit, 10) + "%"
	var enforced EnforcedLimits
	if a.Enforced != nil {
		enforced = *a.Enforced
	}
	switch {
	case enforced.Memory && enforced.Cores:
		return fmt.Sprintf("%s enforces %s and %s", a.Isolation, memory, compute)
	case enforced.Memory:
		return fmt.Sprintf("%s enforces %s; %s not enforced", a.Isolation, memory, compute)
	case enforced.Cores:
		return fmt.Sprintf("%s enforces %s; %s not enforced", a.Isolation, compute, memory)
	}
	return fmt.Sprintf("%s, not enforced: %s and %s", a.Isolation, memory, compute)
}
