// Package locality keeps KubeShare's locality rules between shares of
// independent claims: affinity (shares with the same label on one GPU),
// anti-affinity (never two shares with the same label on one GPU) and
// exclusion (a GPU holding a share labelled X takes only shares labelled X).
//
// A label names a group of the claim's namespace: two namespaces that use
// the same label are two groups, so no tenant can join, pull or repel
// another tenant's shares by using its labels. A DeviceClass whose GpuConfig
// sets locality.scope Cluster makes the labels that config sets
// cluster-wide (Share.ClusterLabels); a claim cannot (the webhook and
// ConfigForRequest refuse locality.scope in a claim's config).
//
// The scheduler places shares; this package judges each placement before the
// pod binds. Shared devices published with model.WithLocalityVerdicts carry a
// binding condition, so the scheduler waits in PreBind until a claim's share
// is accepted (model.LocalityAcceptedCondition True) or rejected
// (model.LocalityRejectedCondition True; the scheduler then deallocates the
// claim and tries again). Controller is the single writer of these verdicts:
// one leader, one worker, judging one claim at a time against the Ledger of
// every share it accepted before, so two placements made concurrently on one
// GPU are never both accepted (docs/locality.md, "Locality verdicts and the
// race between placements").
package locality

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// GPU names a GPU by the shared device that hands out its fractions: the
// pool (the node) and the device (gpu-N-shared).
type GPU struct {
	Pool, Device string
}

func (g GPU) String() string { return g.Pool + "/" + g.Device }

// Labels are a share's locality labels (GpuConfig locality); an empty label
// belongs to no group. Their Scope is not read: where a label reaches is
// whether it is in a Share's Labels or ClusterLabels.
type Labels = configapi.LocalityConfig

// Share is one share of a claim on one GPU.
type Share struct {
	// Claim is namespace/name, for messages.
	Claim string
	UID   types.UID
	// Namespace is the claim's namespace, which scopes Labels.
	Namespace string
	GPU       GPU
	// ShareID tells apart the allocations of one claim: a claim allocated
	// again gets new share IDs.
	ShareID string
	// Labels name groups of Namespace: shares of other namespaces with the
	// same label are not in them.
	Labels Labels
	// ClusterLabels name cluster-wide groups: labels set by a DeviceClass
	// config with locality.scope Cluster. A rule's label is in Labels or in
	// ClusterLabels, not both; ClusterLabels wins where both are set.
	ClusterLabels Labels
}

// group is a locality group: a label in one namespace, or a cluster-wide
// label. The zero value is "no group".
type group struct {
	cluster   bool
	namespace string
	label     configapi.LocalityLabel
}

func (g group) String() string {
	switch {
	case g.label == "":
		return "none"
	case g.cluster:
		return fmt.Sprintf("%q (cluster-wide)", g.label)
	}
	return fmt.Sprintf("%q", g.label)
}

// rule picks one rule's label out of a share's labels.
type rule func(Labels) configapi.LocalityLabel

func affinity(l Labels) configapi.LocalityLabel     { return l.Affinity }
func antiAffinity(l Labels) configapi.LocalityLabel { return l.AntiAffinity }
func exclusion(l Labels) configapi.LocalityLabel    { return l.Exclusion }

// group is the share's group for one rule.
func (s Share) group(r rule) group {
	if l := r(s.ClusterLabels); l != "" {
		return group{cluster: true, label: l}
	}
	if l := r(s.Labels); l != "" {
		return group{namespace: s.Namespace, label: l}
	}
	return group{}
}

// Reason is why a share was rejected; it is the reason of the
// LocalityRejected condition.
type Reason string

const (
	ReasonAffinity     Reason = "Affinity"
	ReasonAntiAffinity Reason = "AntiAffinity"
	ReasonExclusion    Reason = "Exclusion"
	// ReasonInvalidConfig: the claim's GpuConfig does not decode, so its
	// labels are unknown.
	ReasonInvalidConfig Reason = "InvalidConfig"
)

// Verdict is the judgement of one claim's shares.
type Verdict struct {
	Accepted bool
	// Reason and Message say why a claim was rejected; Message names the
	// share in the way.
	Reason  Reason
	Message string
}

// Ledger is the set of shares accepted so far, by claim, with an index by
// GPU and by affinity group. The zero value is empty and ready to use. It is
// not safe for concurrent use: its single owner is what makes verdicts
// race-free.
type Ledger struct {
	claims   map[types.UID][]Share
	gpus     map[GPU]map[types.UID][]Share
	affinity map[group]map[GPU]int // affinity group → GPU → shares of the group there
}

// Set records that the claim uid holds exactly these shares (replacing what
// it held before); with no shares it is Remove.
func (l *Ledger) Set(uid types.UID, shares []Share) {
	l.Remove(uid)
	if len(shares) == 0 {
		return
	}
	if l.claims == nil {
		l.claims = map[types.UID][]Share{}
		l.gpus = map[GPU]map[types.UID][]Share{}
		l.affinity = map[group]map[GPU]int{}
	}
	shares = slices.Clone(shares)
	l.claims[uid] = shares
	for _, s := range shares {
		if l.gpus[s.GPU] == nil {
			l.gpus[s.GPU] = map[types.UID][]Share{}
		}
		l.gpus[s.GPU][uid] = append(l.gpus[s.GPU][uid], s)
		if a := s.group(affinity); a.label != "" {
			if l.affinity[a] == nil {
				l.affinity[a] = map[GPU]int{}
			}
			l.affinity[a][s.GPU]++
		}
	}
}

// Remove forgets the claim uid.
func (l *Ledger) Remove(uid types.UID) {
	for _, s := range l.claims[uid] {
		delete(l.gpus[s.GPU], uid)
		if len(l.gpus[s.GPU]) == 0 {
			delete(l.gpus, s.GPU)
		}
		if a := s.group(affinity); a.label != "" {
			if l.affinity[a][s.GPU]--; l.affinity[a][s.GPU] <= 0 {
				delete(l.affinity[a], s.GPU)
			}
			if len(l.affinity[a]) == 0 {
				delete(l.affinity, a)
			}
		}
	}
	delete(l.claims, uid)
}

// Holds reports whether the ledger holds exactly these shares for their
// claim (same GPUs and share IDs): the claim was accepted as it is allocated
// now.
func (l *Ledger) Holds(uid types.UID, shares []Share) bool {
	held, ok := l.claims[uid]
	if !ok || len(held) != len(shares) {
		return false
	}
	key := func(s Share) string { return s.GPU.String() + "#" + s.ShareID }
	a, b := make([]string, len(held)), make([]string, len(shares))
	for i := range held {
		a[i], b[i] = key(held[i]), key(shares[i])
	}
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// Shares returns the shares the ledger holds on gpu, ordered by claim and
// share ID.
func (l *Ledger) Shares(gpu GPU) []Share {
	var out []Share
	for _, shares := range l.gpus[gpu] {
		out = append(out, shares...)
	}
	slices.SortFunc(out, func(a, b Share) int {
		return cmp.Or(cmp.Compare(a.Claim, b.Claim), cmp.Compare(a.ShareID, b.ShareID))
	})
	return out
}

// Judge decides whether the shares of one claim (uid) may join the shares
// the ledger holds, other than the claim's own. Every share is checked
// against every share on its GPU, and against the claim's other shares:
//
//   - exclusion: all shares on a GPU are in the same exclusion group
//     (shares without one are a group of their own);
//   - anti-affinity: no two shares on a GPU are in the same anti-affinity
//     group;
//   - affinity: all shares of an affinity group are on one GPU.
//
// Groups are per namespace unless cluster-wide (Share.ClusterLabels).
//
// Judge does not change the ledger; the caller records an accepted claim
// with Set before it judges the next one. The first conflict found decides,
// in the order of shares and then of the shares in the way (by claim), so the
// verdict does not depend on map order.
func (l *Ledger) Judge(uid types.UID, shares []Share) Verdict {
	for i, s := range shares {
		others := slices.DeleteFunc(l.Shares(s.GPU), func(o Share) bool { return o.UID == uid })
		for _, o := range shares[:i] {
			if o.GPU == s.GPU {
				others = append(others, o)
			}
		}
		for _, o := range others {
			if reason, msg := conflict(s, o); reason != "" {
				return Verdict{Reason: reason, Message: msg}
			}
		}
		if a := s.group(affinity); a.label != "" {
			var elsewhere []GPU
			for g := range l.affinity[a] {
				if g != s.GPU && l.holdsOthers(g, a, uid) {
					elsewhere = append(elsewhere, g)
				}
			}
			for _, o := range shares[:i] {
				if o.group(affinity) == a && o.GPU != s.GPU {
					elsewhere = append(elsewhere, o.GPU)
				}
			}
			if len(elsewhere) > 0 {
				slices.SortFunc(elsewhere, func(a, b GPU) int { return cmp.Compare(a.String(), b.String()) })
				return Verdict{Reason: ReasonAffinity, Message: fmt.Sprintf(
					"share of %s on %s has affinity %s, whose group is on %s", s.Claim, s.GPU, a, elsewhere[0])}
			}
		}
	}
	return Verdict{Accepted: true}
}

// holdsOthers reports whether a claim other than uid holds a share of
// affinity group a on g.
func (l *Ledger) holdsOthers(g GPU, a group, uid types.UID) bool {
	for other, shares := range l.gpus[g] {
		if other == uid {
			continue
		}
		for _, s := range shares {
			if s.group(affinity) == a {
				return true
			}
		}
	}
	return false
}

// conflict says which rule two shares on one GPU break, if any.
func conflict(s, o Share) (Reason, string) {
	se, oe := s.group(exclusion), o.group(exclusion)
	sa := s.group(antiAffinity)
	switch {
	case se != oe:
		msg := fmt.Sprintf("share of %s (exclusion %s) cannot share %s with %s (exclusion %s)", s.Claim, se, s.GPU, o.Claim, oe)
		if se.label == oe.label {
			msg += "; a label names a group of its own namespace unless a DeviceClass makes it cluster-wide (locality.scope: Cluster)"
		}
		return ReasonExclusion, msg
	case sa.label != "" && sa == o.group(antiAffinity):
		return ReasonAntiAffinity, fmt.Sprintf("share of %s has anti-affinity %s, and so has %s on %s",
			s.Claim, sa, o.Claim, s.GPU)
	}
	return "", ""
}

// Violations lists every broken rule among shares that are all placed at
// once (for example every share on a node): each pair on one GPU that
// breaks exclusion or anti-affinity, and each affinity group spread over
// more than one GPU. Two shares of one claim count as two shares. Empty
// when the rules hold.
func Violations(shares []Share) []string {
	byGPU := map[GPU][]Share{}
	groups := map[group]map[GPU]bool{}
	for _, s := range shares {
		byGPU[s.GPU] = append(byGPU[s.GPU], s)
		if a := s.group(affinity); a.label != "" {
			if groups[a] == nil {
				groups[a] = map[GPU]bool{}
			}
			groups[a][s.GPU] = true
		}
	}
	var out []string
	for _, on := range byGPU {
		for i := range on {
			for _, o := range on[:i] {
				if _, msg := conflict(on[i], o); msg != "" {
					out = append(out, msg)
				}
			}
		}
	}
	for a, gpus := range groups {
		if len(gpus) > 1 {
			names := make([]string, 0, len(gpus))
			for g := range gpus {
				names = append(names, g.String())
			}
			slices.Sort(names)
			where := ""
			if !a.cluster {
				where = " (namespace " + a.namespace + ")"
			}
			out = append(out, fmt.Sprintf("affinity %s is on %d GPUs: %v%s", a, len(gpus), names, where))
		}
	}
	slices.Sort(out)
	return out
}

// Refusing returns the GPUs the ledger knows (those holding shares) on which
// a share of the claim uid would be rejected, in GPU order: where fences
// send a rejected claim first, so that it skips every GPU that would reject
// it instead of trying them one by one. GPUs without shares are not known
// and never refuse.
func (l *Ledger) Refusing(uid types.UID, shares []Share) []GPU {
	var out []GPU
	for _, g := range l.GPUs() {
		if !l.Accepts(uid, shares, g) {
			out = append(out, g)
		}
	}
	return out
}

// Accepts reports whether the claim uid would be accepted with each of its
// shares moved to gpu (capacity aside).
func (l *Ledger) Accepts(uid types.UID, shares []Share, gpu GPU) bool {
	for _, s := range shares {
		moved := s
		moved.GPU = gpu
		if !l.Judge(uid, []Share{moved}).Accepted {
			return false
		}
	}
	return true
}

// GPUs returns the GPUs that hold shares, in order.
func (l *Ledger) GPUs() []GPU {
	return slices.SortedFunc(maps.Keys(l.gpus), func(a, b GPU) int { return cmp.Compare(a.String(), b.String()) })
}
