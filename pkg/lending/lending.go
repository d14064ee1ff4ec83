// Package lending decides when a GPU that its owners hold but do not use is
// lent to preemptible borrowers, and when it is taken back.
//
// A GPU's owners are the claims that hold it whole (gpu-N) or in shares
// (gpu-N-shared); its borrowers are the claims allocated its lending device
// (gpu-N-lent), which consumes none of the GPU's counters. The kubelet
// plugin samples every GPU (NVML per-process utilization and memory mapped
// to the owners' pods) and feeds each sample to [Step], a pure function of
// the GPU's previous [State]:
//
//   - the GPU is lent ([Lent]) once every owner has opted in to lending
//     and the owners have been idle (no process of theirs at or above the
//     busy threshold, no new process, no growth in memory) for the
//     policy's IdlePeriod; the lending device then publishes the memory
//     the owners do not use and loses its taints;
//   - the moment an owner is busy again, or an owner releases the GPU, or
//     the GPU cannot be observed, or the owners change, or the borrowers
//     use more memory than was lent, the GPU is taken back ([Reclaiming]
//     while borrowers remain): the lending device is tainted NoSchedule
//     (no new borrowers) and NoExecute, so kube-controller-manager evicts
//     the borrowers' pods after the tolerationSeconds their claims carry;
//   - an owner never waits for a borrower to be scheduled: the lending
//     device holds none of the GPU's counters.
//
// In short: a GPU idle for a preset time is lent to waiting low-priority
// work, and that work is ended when the high-priority owner uses the GPU
// again; the lending device's DRA device taints do the admitting and the
// evicting.
package lending

import (
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Phase is where a GPU is in the lending cycle. Its value is the value of
// the lending device's taints while the GPU is not lent.
type Phase string

const (
	// NotHeld: no owner holds the GPU.
	NotHeld Phase = "NotHeld"
	// OwnerDoesNotLend: an owner did not opt in to lending.
	OwnerDoesNotLend Phase = "OwnerDoesNotLend"
	// OwnerUsesMPS: an owner's share runs under MPS. Its clients may be
	// invisible to per-process accounting, and borrowers would join (and
	// could disturb) the owners' MPS server: the GPU is not lent.
	OwnerUsesMPS Phase = "OwnerUsesMPS"
	// WaitingForIdle: the owners lend and are idle, not yet for IdlePeriod.
	WaitingForIdle Phase = "WaitingForIdle"
	// NoSpareMemory: the owners are idle, but use too much memory to lend.
	NoSpareMemory Phase = "NoSpareMemory"
	// OwnerBusy: an owner uses the GPU and nothing is lent.
	OwnerBusy Phase = "OwnerBusy"
	// Lent: borrowers may be placed on the GPU's lending device.
	Lent Phase = "Lent"
	// Reclaiming: the GPU is taken back; borrowers remain to be evicted.
	Reclaiming Phase = "Reclaiming"
)

// Reasons for taking a GPU back.
const (
	ReasonOwnerBusy     = "OwnerBusy"
	ReasonOwnerReleased = "OwnerReleased"
	// ReasonOwnersChanged: a claim joined the GPU's owners (or one left
	// while others stay) after it was lent.
	ReasonOwnersChanged = "OwnersChanged"
	// ReasonOwnerDoesNotLend: a holder of the GPU does not consent.
	ReasonOwnerDoesNotLend = "OwnerDoesNotLend"
	// ReasonOwnerUsesMPS: an owner's share runs under MPS.
	ReasonOwnerUsesMPS = "OwnerUsesMPS"
	// ReasonBorrowerOverLimit: the borrowers use more memory than was lent.
	ReasonBorrowerOverLimit = "BorrowerOverLimit"
	ReasonUnobservable      = "GPUUnobservable"
	ReasonNotLent           = "NotLent"
)

// Policy is the node's lending policy.
type Policy struct {
	// IdlePeriod is how long the owners must be idle before the GPU is
	// lent.
	IdlePeriod time.Duration
	// MemorySlack is how much an owner's GPU memory may grow, after the
	// GPU was lent, before the owner counts as busy.
	MemorySlack int64
	// MinLend is the least memory worth lending, in bytes.
	MinLend int64
	// Reserve is memory kept back for the owners when lending, in bytes.
	Reserve int64
}

// DefaultPolicy is the policy of a node that sets no flags.
func DefaultPolicy() Policy {
	return Policy{IdlePeriod: 5 * time.Minute, MemorySlack: 256 << 20, MinLend: 1 << 30, Reserve: 1 << 30}
}

// Validate reports a policy that cannot work.
func (p Policy) Validate() error {
	switch {
	case p.IdlePeriod <= 0:
		return fmt.Errorf("lending idle period %s: must be positive", p.IdlePeriod)
	case p.MemorySlack < 0 || p.MinLend < 0 || p.Reserve < 0:
		return fmt.Errorf("lending memory slack %d, minimum %d, reserve %d: must not be negative", p.MemorySlack, p.MinLend, p.Reserve)
	}
	return nil
}

// Owner is a claim that holds the GPU whole or in a share.
type Owner struct {
	Claim types.UID
	// Lend is true when the claim's config lets Tessera lend the GPU.
	Lend bool
	// MPS is true when the claim's share of the GPU runs under MPS.
	MPS bool
	// Whole is true when the claim holds the whole GPU (gpu-N).
	Whole bool
	// Memory is the GPU memory the claim's shares are entitled to, in
	// bytes (their consumed capacity); 0 for a whole GPU.
	Memory int64
}

// Observation is one sample of a GPU.
type Observation struct {
	// Owners hold the GPU; admin access is no owner.
	Owners []Owner
	// OwnerWaiting is true when a claim that does not lend waits to be
	// prepared on the GPU (prepare refuses it while borrowers remain): the
	// GPU is taken back as if that claim held it already.
	OwnerWaiting bool
	// Borrowers are the claims prepared on the GPU's lending device.
	Borrowers []types.UID
	// Observed is false when the GPU could not be sampled; the GPU is then
	// taken back, since owner activity cannot be seen.
	Observed bool
	// Busy is true when a process of an owner's pods computed at or above
	// the node's busy threshold since the previous sample.
	Busy bool
	// OwnerMemory is the GPU memory the owners' processes use, in bytes.
	OwnerMemory int64
	// OwnerProcesses are the PIDs of the owners' processes on the GPU.
	OwnerProcesses []uint32
	// Memory is the GPU's memory, in bytes.
	Memory int64
	// FreeMemory is the GPU's free memory as the driver reports it, in
	// bytes; lending never offers more than it (less the reserve). Zero
	// means unknown.
	FreeMemory int64
	// BorrowerMemory is the GPU memory the borrowers' processes use.
	BorrowerMemory int64
}

// State is what is remembered of a GPU between samples (and restarts).
type State struct {
	Phase Phase `json:"phase"`
	// Since is when the GPU entered Phase.
	Since time.Time `json:"since"`
	// IdleSince is when the owners were last seen turning idle; zero while
	// they are busy.
	IdleSince time.Time `json:"idleSince,omitzero"`
	// Lendable is the memory the lending device publishes while Lent and
	// Reclaiming, in bytes.
	Lendable int64 `json:"lendable,omitempty"`
	// OwnerMemory and OwnerProcesses are the owners' footprint when the GPU
	// was lent, or at the previous sample while waiting for idle: growth
	// beyond it is activity.
	OwnerMemory    int64    `json:"ownerMemory,omitempty"`
	OwnerProcesses []uint32 `json:"ownerProcesses,omitempty"`
	// Owners are the owner claims when the GPU was lent: a change is a
	// reason to take it back.
	Owners []types.UID `json:"owners,omitempty"`
	// Reason is why the GPU is being taken back (Reclaiming).
	Reason string `json:"reason,omitempty"`
}

// Open reports whether borrowers may be placed on the GPU.
func (s State) Open() bool { return s.Phase == Lent }

// TaintValue is the value of the lending device's taints while not Open.
func (s State) TaintValue() string {
	if s.Phase == "" {
		return string(NotHeld)
	}
	return string(s.Phase)
}

// Step returns the GPU's state after observation o at time now. It is pure:
// the result depends only on its arguments.
func Step(p Policy, s State, o Observation, now time.Time) State {
	next := s
	next.Phase, next.Reason = decide(p, s, o, now)
	switch next.Phase {
	case Lent:
		if s.Phase != Lent {
			next.Lendable = lendable(p, o)
			next.OwnerMemory, next.OwnerProcesses = o.OwnerMemory, slices.Clone(o.OwnerProcesses)
			next.Owners = ownerClaims(o.Owners)
		}
	case Reclaiming:
		next.IdleSince = time.Time{}
	case WaitingForIdle, NoSpareMemory:
		if next.IdleSince.IsZero() {
			next.IdleSince = now
		}
		// The footprint to compare the next sample with.
		next.OwnerMemory, next.OwnerProcesses = o.OwnerMemory, slices.Clone(o.OwnerProcesses)
	default:
		next.IdleSince = time.Time{}
	}
	switch next.Phase {
	case Lent, Reclaiming:
	case WaitingForIdle, NoSpareMemory:
		next.Lendable, next.Owners = 0, nil
	default:
		next.Lendable, next.OwnerMemory, next.OwnerProcesses, next.Owners = 0, 0, nil, nil
	}
	if next.Phase != s.Phase || next.Since.IsZero() {
		next.Since = now
	}
	return next
}

func decide(p Policy, s State, o Observation, now time.Time) (Phase, string) {
	borrowed := len(o.Borrowers) > 0
	// A reclaim runs until the last borrower is gone, whatever the owners
	// do meanwhile: the borrowers' pods are being evicted.
	if s.Phase == Reclaiming && borrowed {
		return Reclaiming, s.Reason
	}
	var (
		phase  Phase
		reason string
	)
	switch {
	case o.OwnerWaiting:
		phase, reason = OwnerDoesNotLend, ReasonOwnerDoesNotLend
	case len(o.Owners) == 0:
		phase, reason = NotHeld, ReasonOwnerReleased
	case slices.ContainsFunc(o.Owners, func(w Owner) bool { return !w.Lend }):
		phase, reason = OwnerDoesNotLend, ReasonOwnerDoesNotLend
	case slices.ContainsFunc(o.Owners, func(w Owner) bool { return w.MPS }):
		phase, reason = OwnerUsesMPS, ReasonOwnerUsesMPS
	case !o.Observed:
		phase, reason = OwnerBusy, ReasonUnobservable
	case s.Phase == Lent && !slices.Equal(ownerClaims(o.Owners), s.Owners):
		phase, reason = OwnerBusy, ReasonOwnersChanged
	case busy(p, s, o):
		phase, reason = OwnerBusy, ReasonOwnerBusy
	case s.Phase == Lent && o.BorrowerMemory > s.Lendable+p.MemorySlack:
		phase, reason = OwnerBusy, ReasonBorrowerOverLimit
	case s.Phase == Lent:
		return Lent, ""
	default:
		idleSince := s.IdleSince
		if idleSince.IsZero() {
			idleSince = now
		}
		switch {
		case now.Sub(idleSince) < p.IdlePeriod:
			phase = WaitingForIdle
		case lendable(p, o) < max(p.MinLend, 1):
			phase = NoSpareMemory
		default:
			return Lent, ""
		}
	}
	if borrowed || s.Phase == Lent {
		// Borrowers exist only while the GPU is lent; anything else takes
		// the GPU back.
		if !borrowed {
			return phase, ""
		}
		if reason == "" {
			reason = ReasonNotLent
		}
		return Reclaiming, reason
	}
	return phase, ""
}

// busy reports owner activity: a busy process or, compared with the
// footprint kept while lent or waiting for idle, a process the owners did
// not have or memory they did not use.
func busy(p Policy, s State, o Observation) bool {
	if o.Busy {
		return true
	}
	switch s.Phase {
	case Lent, WaitingForIdle, NoSpareMemory:
	default:
		return false
	}
	if o.OwnerMemory > s.OwnerMemory+p.MemorySlack {
		return true
	}
	for _, pid := range o.OwnerProcesses {
		if !slices.Contains(s.OwnerProcesses, pid) {
			return true
		}
	}
	return false
}

// ownerClaims are the owners' claim UIDs, sorted.
func ownerClaims(owners []Owner) []types.UID {
	out := make([]types.UID, 0, len(owners))
	for _, o := range owners {
		out = append(out, o.Claim)
	}
	slices.Sort(out)
	return out
}

// lendable is the memory the owners leave, never more than the driver
// reports free, less the reserve, in whole MiB. Owners in shares leave the
// GPU's memory less what their shares are entitled to (their consumed
// capacity), not less what they use now: a share that wakes may use all of
// its memory at once, and a borrower must not hold any of it. The owner of
// a whole GPU is entitled to all of it; by lending it agrees to lend what
// it does not use, and gets it back within the reclaim bound (the
// borrowers' grace plus the plugin's kill margin).
func lendable(p Policy, o Observation) int64 {
	left := o.Memory - o.OwnerMemory
	if !slices.ContainsFunc(o.Owners, func(w Owner) bool { return w.Whole }) {
		var entitled int64
		for _, w := range o.Owners {
			entitled += w.Memory
		}
		left = min(left, o.Memory-entitled)
	}
	if o.FreeMemory > 0 {
		left = min(left, o.FreeMemory)
	}
	free := left - p.Reserve
	if free <= 0 {
		return 0
	}
	return free &^ (1<<20 - 1)
}
