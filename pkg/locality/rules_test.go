package locality

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/model"
)

func gpuN(n int) GPU { return GPU{Pool: "node", Device: "gpu-" + string(rune('0'+n)) + "-shared"} }

func share(claim string, gpu int, l Labels) Share {
	return Share{Claim: "ns/" + claim, UID: types.UID(claim), Namespace: "ns", GPU: gpuN(gpu), ShareID: claim + "-s", Labels: l}
}

func TestJudge(t *testing.T) {
	tests := []struct {
		name   string
		held   []Share
		claim  []Share
		reason Reason // empty: accepted
		msg    string
	}{
		{name: "empty GPU", claim: []Share{share("c", 0, Labels{Exclusion: "x", AntiAffinity: "a", Affinity: "g"})}},
		{name: "unlabelled with unlabelled", held: []Share{share("h", 0, Labels{})}, claim: []Share{share("c", 0, Labels{})}},
		{
			name: "exclusion: unlabelled share on a GPU of group x", held: []Share{share("h", 0, Labels{Exclusion: "x"})},
			claim: []Share{share("c", 0, Labels{})}, reason: ReasonExclusion,
			msg: `share of ns/c (exclusion none) cannot share node/gpu-0-shared with ns/h (exclusion "x")`,
		},
		{
			name: "exclusion: share of x on a GPU with unlabelled shares", held: []Share{share("h", 0, Labels{})},
			claim: []Share{share("c", 0, Labels{Exclusion: "x"})}, reason: ReasonExclusion,
		},
		{
			name: "exclusion: x and y", held: []Share{share("h", 0, Labels{Exclusion: "y"})},
			claim: []Share{share("c", 0, Labels{Exclusion: "x"})}, reason: ReasonExclusion,
		},
		{name: "exclusion: x with x", held: []Share{share("h", 0, Labels{Exclusion: "x"})}, claim: []Share{share("c", 0, Labels{Exclusion: "x"})}},
		{name: "exclusion: x on another GPU", held: []Share{share("h", 1, Labels{Exclusion: "x"})}, claim: []Share{share("c", 0, Labels{})}},
		{
			name: "anti-affinity on one GPU", held: []Share{share("h", 0, Labels{AntiAffinity: "a"})},
			claim: []Share{share("c", 0, Labels{AntiAffinity: "a"})}, reason: ReasonAntiAffinity,
			msg: `share of ns/c has anti-affinity "a", and so has ns/h on node/gpu-0-shared`,
		},
		{name: "anti-affinity, other label", held: []Share{share("h", 0, Labels{AntiAffinity: "b"})}, claim: []Share{share("c", 0, Labels{AntiAffinity: "a"})}},
		{name: "anti-affinity on other GPUs", held: []Share{share("h", 1, Labels{AntiAffinity: "a"})}, claim: []Share{share("c", 0, Labels{AntiAffinity: "a"})}},
		{name: "anti-affinity against an unlabelled share", held: []Share{share("h", 0, Labels{})}, claim: []Share{share("c", 0, Labels{AntiAffinity: "a"})}},
		{name: "affinity joins its group", held: []Share{share("h", 0, Labels{Affinity: "g"})}, claim: []Share{share("c", 0, Labels{Affinity: "g"})}},
		{
			name: "affinity away from its group", held: []Share{share("h", 1, Labels{Affinity: "g"})},
			claim: []Share{share("c", 0, Labels{Affinity: "g"})}, reason: ReasonAffinity,
			msg: `share of ns/c on node/gpu-0-shared has affinity "g", whose group is on node/gpu-1-shared`,
		},
		{name: "affinity: first of its group, beside another group", held: []Share{share("h", 0, Labels{Affinity: "other"})}, claim: []Share{share("c", 0, Labels{Affinity: "g"})}},
		{
			name:  "affinity on the group's GPU, but anti-affinity there too",
			held:  []Share{share("h", 0, Labels{Affinity: "g", AntiAffinity: "a"})},
			claim: []Share{share("c", 0, Labels{Affinity: "g", AntiAffinity: "a"})}, reason: ReasonAntiAffinity,
		},
		{
			name: "two shares of one claim with one anti-affinity on one GPU",
			claim: []Share{share("c", 0, Labels{AntiAffinity: "a"}), func() Share {
				s := share("c", 0, Labels{AntiAffinity: "a"})
				s.ShareID = "c-2"
				return s
			}()}, reason: ReasonAntiAffinity,
		},
		{
			name:   "two shares of one claim with one affinity on two GPUs",
			claim:  []Share{share("c", 0, Labels{Affinity: "g"}), share("c", 1, Labels{Affinity: "g"})},
			reason: ReasonAffinity,
		},
		{
			name:  "the claim's own earlier acceptance is not in its way",
			held:  []Share{share("c", 1, Labels{Affinity: "g", AntiAffinity: "a"})},
			claim: []Share{share("c", 0, Labels{Affinity: "g", AntiAffinity: "a"})},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l Ledger
			for _, h := range tc.held {
				l.Set(h.UID, append(l.claims[h.UID], h))
			}
			v := l.Judge(tc.claim[0].UID, tc.claim)
			if v.Accepted != (tc.reason == "") || v.Reason != tc.reason {
				t.Fatalf("verdict %+v, want reason %q", v, tc.reason)
			}
			if tc.msg != "" && v.Message != tc.msg {
				t.Errorf("message\n got: %s\nwant: %s", v.Message, tc.msg)
			}
		})
	}
}

func TestLedgerSetRemove(t *testing.T) {
	var l Ledger
	l.Set("a", []Share{share("a", 0, Labels{Affinity: "g"})})
	l.Set("a", []Share{share("a", 1, Labels{Affinity: "g"})}) // allocated again elsewhere
	if got := l.Shares(gpuN(0)); len(got) != 0 {
		t.Errorf("gpu 0 still holds %v", got)
	}
	if v := l.Judge("b", []Share{share("b", 0, Labels{Affinity: "g"})}); v.Accepted {
		t.Error("group g moved to gpu 1, but a share of g is accepted on gpu 0")
	}
	l.Remove("a")
	if v := l.Judge("b", []Share{share("b", 0, Labels{Affinity: "g"})}); !v.Accepted {
		t.Errorf("after the group left: %+v", v)
	}
	if len(l.claims) != 0 || len(l.gpus) != 0 || len(l.affinity) != 0 {
		t.Errorf("ledger not empty after Remove: %+v", l)
	}
	if !(&Ledger{}).Judge("x", nil).Accepted {
		t.Error("a claim without shares is rejected")
	}
}

func TestViolations(t *testing.T) {
	got := Violations([]Share{
		share("a", 0, Labels{Exclusion: "x"}), share("b", 0, Labels{}),
		share("c", 1, Labels{AntiAffinity: "n"}), share("d", 1, Labels{AntiAffinity: "n"}),
		share("e", 2, Labels{Affinity: "g"}), share("f", 3, Labels{Affinity: "g"}),
		share("g", 4, Labels{Exclusion: "y", AntiAffinity: "m", Affinity: "h"}), share("h", 4, Labels{Exclusion: "y", Affinity: "h"}),
	})
	if len(got) != 3 {
		t.Fatalf("got %d violations, want 3:\n%s", len(got), strings.Join(got, "\n"))
	}
	for i, want := range []string{`affinity "g" is on 2 GPUs`, `(exclusion none)`, `anti-affinity "n"`} {
		if !strings.Contains(got[i], want) {
			t.Errorf("violation %d: %s, want it to mention %s", i, got[i], want)
		}
	}
}

// isShared agrees with pkg/model's device names.
func TestIsSharedMatchesModel(t *testing.T) {
	for _, name := range []string{model.SharedDeviceName(0), model.SharedDeviceName(15), model.WholeDeviceName(3), model.LentDeviceName(2),
		"gpu-01-shared", "gpu--1-shared", "gpu-x-shared", "other-0-shared", "gpu-3-shared-lent"} {
		_, kind, err := model.ParseDevice(name)
		if want := err == nil && kind == model.KindShared; isShared(name) != want {
			t.Errorf("isShared(%q) = %v, want %v", name, !want, want)
		}
	}
}
