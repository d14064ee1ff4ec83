package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of GpuConfig; it equals the driver name.
const GroupName = "gpu.tessera.dev"

// Version is this API version.
const Version = "v1alpha1"

// GpuConfigKind is the kind of the only type in this group.
const GpuConfigKind = "GpuConfig"

// SchemeGroupVersion is group and version of this API.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// GpuConfig is the opaque configuration users put into a ResourceClaim (or admins
// into a DeviceClass) for devices of driver gpu.tessera.dev.
//
// Every field is optional. A nil section or an empty value means "not set here":
// when configs are merged (ConfigForRequest) an unset field keeps what an earlier
// config set, and Default fills what is still unset.
//
// The type holds plain typed values only: nothing in it names an environment
// variable, a mount, a hook or a host path, so a config cannot make the driver inject
// arbitrary edits into a container. New fields must keep it that way.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Sharing applies to shares (devices gpu-N-shared); it is ignored for whole GPUs.
	Sharing *SharingConfig `json:"sharing,omitempty"`
	// Topology applies to claims with more than one GPU.
	Topology *TopologyConfig `json:"topology,omitempty"`
	// Lending applies to the GPUs the claim holds, whole or in shares.
	Lending *LendingConfig `json:"lending,omitempty"`
	// Locality applies to shares: which other shares may be on the same GPU.
	// It is ignored for whole GPUs, which are never shared.
	Locality *LocalityConfig `json:"locality,omitempty"`
}

// LocalityConfig is KubeShare's three locality rules between shares of
// independent claims (docs/locality.md). Each rule names a group by a label;
// an empty label is not a member of any group. The rules hold only where the
// locality controller runs (chart value locality.enabled): it accepts or
// rejects each placement the scheduler makes, through device binding
// conditions, before the pod binds. Without the controller the labels are
// recorded and ignored.
type LocalityConfig struct {
	// Affinity puts every share with this label on one GPU: a share with
	// the label is accepted only on the GPU that already holds the group (or
	// anywhere, for the group's first share).
	Affinity LocalityLabel `json:"affinity,omitempty"`
	// AntiAffinity keeps shares with this label on different GPUs: a share is
	// refused on a GPU that holds another share with the same label.
	AntiAffinity LocalityLabel `json:"antiAffinity,omitempty"`
	// Exclusion keeps a GPU to one group: a GPU holding a share labelled X
	// takes only shares labelled X, and a share labelled X goes only to a GPU
	// whose shares are all labelled X (or to a GPU without shares). Shares
	// without the label are a group of their own for this rule.
	Exclusion LocalityLabel `json:"exclusion,omitempty"`
	// Scope says where the groups named here reach. Namespace (the default):
	// a label names a group of the claim's namespace only, so two namespaces
	// that use the same label are two groups and no tenant can join, attract
	// or repel another's shares. Cluster: the labels this DeviceClass config
	// sets name groups across namespaces. Only a DeviceClass config may set
	// it (ValidateForClaim refuses it in a claim), and it reaches only the
	// labels a class config sets: a label the claim sets itself stays in the
	// claim's namespace.
	Scope LocalityScope `json:"scope,omitempty"`
}

// LocalityScope is where a locality group reaches: one namespace or the
// whole cluster.
type LocalityScope string

const (
	// LocalityScopeNamespace keeps a group to the namespace of the claims
	// whose labels name it. The default.
	LocalityScopeNamespace LocalityScope = "Namespace"
	// LocalityScopeCluster makes the groups a DeviceClass config names
	// cluster-wide: shares of every namespace with that class label are one
	// group.
	LocalityScopeCluster LocalityScope = "Cluster"
)

// SupportedLocalityScopes lists the valid LocalityScope values.
var SupportedLocalityScopes = []LocalityScope{LocalityScopeNamespace, LocalityScopeCluster}

// LocalityLabel names a locality group: empty (no group) or a Kubernetes
// label value (at most 63 characters of letters, digits, '-', '_' and '.',
// beginning and ending with a letter or digit), which Validate checks. It
// is compared, never used as a name, path or variable on the node: the
// kubelet plugin ignores it.
type LocalityLabel string

// LendingConfig is an owner's consent to lend its GPU while it idles.
type LendingConfig struct {
	// LendWhenIdle lets the node lend the GPU to preemptible borrowers (the
	// DeviceClass lent.gpu.tessera.dev) while every claim holding the GPU
	// lends and has been idle for the node's idle period; the GPU is taken
	// back the moment one of them uses it again. Borrowers are evicted then,
	// after at most their reclaim grace. Default: false (never lent).
	LendWhenIdle *bool `json:"lendWhenIdle,omitempty"`
}

// Isolation names how a share's limits are enforced inside the container.
type Isolation string

const (
	// IsolationAdvisory sets the limit environment only; frameworks that read it
	// (and TF_FORCE_GPU_ALLOW_GROWTH) cooperate, nothing enforces it.
	IsolationAdvisory Isolation = "Advisory"
	// IsolationMPS runs an MPS control daemon per shared GPU and sets the MPS
	// memory and active-thread limits for the client. A claim with MPS must be
	// exactly one share: prepare refuses one with more than one GPU.
	IsolationMPS Isolation = "MPS"
	// IsolationHAMiCore preloads HAMi-core's libvgpu.so, which enforces memory and
	// SM limits by intercepting the CUDA driver API.
	IsolationHAMiCore Isolation = "HAMiCore"
	// IsolationDriverMemory has the NVIDIA driver (r615 and newer) enforce the
	// share's memory in the kernel, through the cgroup v2 dmem controller, set
	// by the NVIDIA container toolkit's apply-cuda-memory-limits CDI hook.
	// Compute is not limited. Only nodes that publish the device attribute
	// gpu.tessera.dev/driverMemoryLimits=true can prepare it; elsewhere
	// prepare fails. A claim with DriverMemory must be exactly one share.
	IsolationDriverMemory Isolation = "DriverMemory"
)

// SupportedIsolations lists the valid Isolation values, in the order error
// messages name them.
var SupportedIsolations = []Isolation{IsolationAdvisory, IsolationMPS, IsolationHAMiCore, IsolationDriverMemory}

// SharingConfig is how a share's fraction is enforced.
type SharingConfig struct {
	// Isolation backend, one of SupportedIsolations (case-sensitive).
	//
	// Precedence when the claim is prepared: a DeviceClass config sets it, a
	// claim config overrides that (the claim wins); only when neither a class
	// nor a claim config that applies to the request sets it does the node's
	// --default-isolation flag of the kubelet plugin (Advisory unless the
	// admin changed it) apply. Default, which knows no node, fills Advisory.
	Isolation Isolation `json:"isolation,omitempty"`
	// ComputeLimit caps the share's compute, in percent of the GPU (1..100). It
	// must be at least the cores the share was allocated, which are its guarantee
	// (KubeShare's request/limit: guarantee what was requested, allow bursting up
	// to the limit). Default: the allocated cores, or 100 when the share was
	// allocated no cores. The admission webhook refuses a claim whose own config
	// sets it below the cores its request asks for.
	ComputeLimit *int32 `json:"computeLimit,omitempty"`
	// MemoryLimit caps the share's GPU memory: a whole number of bytes, at least
	// 1Mi, and at most the memory the share was allocated (memory is never
	// overcommitted). Default: the allocated memory. The admission webhook
	// refuses a claim whose own config sets it above the memory its request
	// asks for; a share that asks for no memory is allocated all of its GPU's.
	MemoryLimit *resource.Quantity `json:"memoryLimit,omitempty"`
	// AllowedIsolations is a DeviceClass's floor: the isolation backends a
	// share of the class may end up with, each one of SupportedIsolations,
	// listed once, at least one. Leaving it out allows every backend.
	//
	// Only a DeviceClass config may set it. A claim's config that sets it is
	// refused (ValidateForClaim; ConfigForRequest refuses a FromClaim entry with
	// it, and so does the admission webhook): a claim chooses sharing.isolation
	// among what its class allows, it cannot widen the list.
	//
	// The isolation a share gets (the claim's config, else the class's, else the
	// node's --default-isolation) must be in the list, or the kubelet plugin
	// refuses to prepare the claim; the admission webhook refuses a claim whose
	// own config asks for an isolation outside it. When several class configs
	// that apply to a request set it, the isolation must be in every one of
	// them: merged (ConfigForRequest), the field holds the isolations all of
	// them list. Whole GPUs have no isolation backend; the list does not apply
	// to them. An admin who pins enforced shares sets both, for example
	// isolation MPS and allowedIsolations [MPS, HAMiCore], so that claims that
	// set no isolation get MPS rather than the node's default.
	AllowedIsolations []Isolation `json:"allowedIsolations,omitempty"`
}

// NVLinkPolicy says what a multi-GPU claim needs from NVLink.
type NVLinkPolicy string

const (
	// NVLinkRequired fails preparation unless all GPUs of the claim share an
	// NVLink domain. Only a matchAttribute gpu.tessera.dev/nvlinkDomain
	// constraint makes the scheduler pick such GPUs; the admission webhook
	// refuses Required on a claim that may get more than one GPU without one.
	NVLinkRequired NVLinkPolicy = "Required"
	// NVLinkPreferred prepares anyway and records a condition when they do not.
	NVLinkPreferred NVLinkPolicy = "Preferred"
	// NVLinkIgnore does not check.
	NVLinkIgnore NVLinkPolicy = "Ignore"
)

// SupportedNVLinkPolicies lists the valid NVLinkPolicy values, in the order error
// messages name them.
var SupportedNVLinkPolicies = []NVLinkPolicy{NVLinkRequired, NVLinkPreferred, NVLinkIgnore}

// TopologyConfig is what a multi-GPU claim needs between its GPUs.
type TopologyConfig struct {
	// NVLink policy, one of SupportedNVLinkPolicies (case-sensitive). Default: Ignore.
	NVLink NVLinkPolicy `json:"nvlink,omitempty"`
}
