package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// ClaimState is how far preparing a claim got.
type ClaimState string

const (
	// PrepareStarted is written before any side effect (CDI spec, MPS
	// daemon). Found after a restart, it means side effects may be half done.
	PrepareStarted ClaimState = "PrepareStarted"
	// PrepareCompleted is written after all side effects succeeded.
	PrepareCompleted ClaimState = "PrepareCompleted"
)

// Device is one prepared device of a claim.
type Device struct {
	Request      string   `json:"request"` // request name from the allocation result ("gpus" or "gpus/nvlink")
	Pool         string   `json:"pool"`
	Device       string   `json:"device"` // gpu-3 or gpu-3-shared
	ShareID      string   `json:"shareID,omitempty"`
	UUID         string   `json:"uuid"`
	Minor        int      `json:"minor"`
	Isolation    string   `json:"isolation,omitempty"`   // Advisory|MPS|HAMiCore for shares
	MemoryLimit  int64    `json:"memoryLimit,omitempty"` // bytes; 0 = whole GPU/no limit
	CoresLimit   int64    `json:"coresLimit,omitempty"`  // percent; 0 = whole GPU/no limit
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// AdminAccess is true for a result with adminAccess: the container may
	// use the GPU, but the result grants nothing (it holds no share of the
	// GPU and blocks no other claim), so accounting and the double-grant
	// index skip it.
	AdminAccess bool `json:"adminAccess,omitempty"`
	// ConsumedMemory and ConsumedCores are the share's consumedCapacity from
	// the allocation result (bytes, percent); 0 for whole GPUs and admin
	// access. They are what the share takes from the GPU's capacity, which
	// can differ from the limits (GpuConfig may lower a limit).
	ConsumedMemory int64 `json:"consumedMemory,omitempty"`
	ConsumedCores  int64 `json:"consumedCores,omitempty"`
	// Lend is the owner's consent (GpuConfig lending.lendWhenIdle) to lend
	// the GPU of this whole or shared device while it idles.
	Lend bool `json:"lend,omitempty"`
	// MPSDomain is the trust domain whose MPS control daemon serves an MPS
	// share (the claim's namespace). Records written before per-domain
	// daemons have none: their share uses the GPU-wide daemon of that
	// release, which is kept until they are unprepared. Older readers
	// ignore the member (a v1 addition they need not understand).
	MPSDomain string `json:"mpsDomain,omitempty"`
	// MIG is set for a MIG device (gpu-N-mig-…); UUID and Minor are then
	// its parent GPU's. Older readers ignore the member (a v1 addition):
	// a release without MIG neither prepares MIG devices nor destroys
	// their instances; the next release with MIG keeps an instance no
	// record names as foreign (it destroys only what a record names).
	MIG *MIGDevice `json:"mig,omitempty"`
}

// MIGDevice is a MIG device of a claim: the instance it is, or (dynamic
// MIG, before the instance exists) the one prepare is about to create.
type MIGDevice struct {
	// Dynamic is true when the plugin creates the instance for the claim
	// and destroys it at unprepare; false for an instance an admin made
	// (static MIG), which stays.
	Dynamic bool `json:"dynamic,omitempty"`
	// Profile and ProfileID are the GPU-instance profile ("3g.40gb").
	Profile   string `json:"profile"`
	ProfileID int    `json:"profileID"`
	// Start and Size are the instance's placement (memory slices). The
	// instance is found by placement and profile, never by its IDs alone:
	// the driver reuses IDs.
	Start int `json:"start"`
	Size  int `json:"size"`
	// UUID is the MIG device's "MIG-…" UUID; empty while a dynamic
	// instance is only intended (recorded before it is created).
	UUID string `json:"uuid,omitempty"`
	// GPUInstance and ComputeInstance are the instance IDs, valid with
	// UUID.
	GPUInstance     int `json:"gpuInstance,omitempty"`
	ComputeInstance int `json:"computeInstance,omitempty"`
	// GPUInstanceMinor and ComputeInstanceMinor are the minors of the
	// capability nodes /dev/nvidia-caps/nvidia-cap<N> (0: unknown).
	GPUInstanceMinor     int `json:"gpuInstanceMinor,omitempty"`
	ComputeInstanceMinor int `json:"computeInstanceMinor,omitempty"`
	// MemoryBytes is the MIG device's memory.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// OtherComputeInstances are the GPU instance's compute instances after
	// the first (UUID, ComputeInstance, ComputeInstanceMinor) of a static
	// MIG device: the device is the whole GPU instance, with every compute
	// instance in it (they share its memory and engines). Older readers
	// ignore the member (a v1 addition); a record of theirs names one
	// compute instance.
	OtherComputeInstances []MIGComputeInstance `json:"otherComputeInstances,omitempty"`
}

// MIGComputeInstance is one more compute instance of a MIG device's GPU
// instance.
type MIGComputeInstance struct {
	ID    int    `json:"id"`
	UUID  string `json:"uuid"`
	Minor int    `json:"minor,omitempty"`
}

// Created reports whether the instance exists (its IDs are recorded).
func (m *MIGDevice) Created() bool { return m != nil && m.UUID != "" }

// Grants reports whether the device holds part of its GPU: false for admin
// access, which observes a GPU without taking any of it.
func (d Device) Grants() bool { return !d.AdminAccess }

// Claim is the checkpointed record of one prepared (or being prepared) claim.
type Claim struct {
	UID       types.UID  `json:"uid"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	State     ClaimState `json:"state"`
	Devices   []Device   `json:"devices,omitempty"`
	// Pods are the UIDs of the pods the claim was reserved for
	// (status.reservedFor, resource "pods") when it was prepared, recorded
	// only for a claim generated for one pod from a ResourceClaimTemplate:
	// the kubelet prepares a claim once per node, so pods that start on a
	// shared claim later never reach the plugin. Empty: not known (a shared
	// claim, or a record of a release before this member). Older readers
	// ignore the member (a v1 addition).
	Pods []types.UID `json:"pods,omitempty"`
	// Config is the merged GpuConfig as written by the plugin. The store keeps
	// it as compact JSON (Put compacts it), so what Get returns is byte-equal
	// before and after a restart; the plugin reads it back leniently.
	Config json.RawMessage `json:"config,omitempty"`
}

// String names the claim the way errors and logs do: "default/train-0 (uid …)".
func (c Claim) String() string {
	return fmt.Sprintf("%s/%s (uid %s)", c.Namespace, c.Name, c.UID)
}

// Store is the plugin's view of the checkpoint. [File] is the durable one,
// [Memory] an in-memory one for tests of other packages. All methods are safe
// for concurrent use. Returned claims are copies: mutating them does not
// change the store.
type Store interface {
	// Get returns the claim with this uid, if present.
	Get(uid types.UID) (Claim, bool)
	// List returns all claims sorted by UID.
	List() []Claim
	// Put inserts or replaces the claim with c.UID. It is durable when it
	// returns nil. On an error wrapping [ErrNotDurable] the change was made
	// (in memory and in the file) but may not survive a power loss; on any
	// other error nothing changed. Either way Get, List and the file agree.
	Put(c Claim) error
	// Delete removes the claim, with the same outcomes as Put. Deleting an
	// unknown uid is not an error and does not write.
	Delete(uid types.UID) error
	// Refresh picks up what another process wrote since this store last read
	// or wrote, and reports whether the claims changed. During a rolling update
	// two plugin instances share the file; the kubelet plugin helper serializes
	// their calls with a file lock, and each call refreshes first, so neither
	// instance overwrites an entry the other wrote. On error (an unreadable
	// file) the store keeps what it had.
	Refresh() (changed bool, err error)
}

// normalize validates c and returns a deep copy with Config compacted, so
// that the stored value never aliases the caller's slices.
func normalize(c Claim) (Claim, error) {
	if c.UID == "" {
		return Claim{}, fmt.Errorf("claim %s/%s: empty uid", c.Namespace, c.Name)
	}
	switch c.State {
	case PrepareStarted, PrepareCompleted:
	default:
		return Claim{}, fmt.Errorf("claim %s: unknown state %q (want %s or %s)", c, c.State, PrepareStarted, PrepareCompleted)
	}
	cfg, err := compactConfig(c.Config)
	if err != nil {
		return Claim{}, fmt.Errorf("claim %s: config: %w", c, err)
	}
	out := clone(c)
	out.Config = cfg
	return out, nil
}

// compactConfig returns raw as encoding/json writes it into the file
// (compact, HTML-escaped), or nil for empty input.
func compactConfig(raw json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	// Marshalling a RawMessage validates and compacts it exactly as it
	// will be compacted when the file is written.
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// cloneOf returns a deep copy of the claim claims holds for uid.
func cloneOf(claims map[types.UID]Claim, uid types.UID) (Claim, bool) {
	c, ok := claims[uid]
	if !ok {
		return Claim{}, false
	}
	return clone(c), true
}

// clone returns a deep copy of c.
func clone(c Claim) Claim {
	out := c
	if c.Devices != nil {
		out.Devices = make([]Device, len(c.Devices))
		for i, d := range c.Devices {
			d.CDIDeviceIDs = slices.Clone(d.CDIDeviceIDs)
			if d.MIG != nil {
				m := *d.MIG
				m.OtherComputeInstances = slices.Clone(m.OtherComputeInstances)
				d.MIG = &m
			}
			out.Devices[i] = d
		}
	}
	out.Pods = slices.Clone(c.Pods)
	out.Config = bytes.Clone(c.Config)
	return out
}

// sortedClaims returns deep copies of the claims in m, sorted by UID.
func sortedClaims(m map[types.UID]Claim) []Claim {
	out := make([]Claim, 0, len(m))
	for _, c := range m {
		out = append(out, clone(c))
	}
	slices.SortFunc(out, func(a, b Claim) int { return cmp.Compare(a.UID, b.UID) })
	return out
}
