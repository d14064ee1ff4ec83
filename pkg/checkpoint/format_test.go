package checkpoint

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// TestEncodeMatchesDocumentedLayout checks the hand-built encoder against
// the layout and checksum rule the package documents.
func TestEncodeMatchesDocumentedLayout(t *testing.T) {
	claims := map[types.UID]Claim{
		"b": mustNormalize(t, testClaim("b", PrepareStarted)),
		"a": mustNormalize(t, Claim{UID: "a", Namespace: "x<y>&z", Name: "n", State: PrepareCompleted,
			Config: json.RawMessage(`{"note": "<&>"}`)}),
	}
	data := encodeAsDocumented(t, claims, "")
	c, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(claims, c.Claims); diff != "" {
		t.Fatalf("decode(encode(x)) (-x +got):\n%s", diff)
	}
}

// encodeAsDocumented encodes claims and fails the test (its messages
// prefixed by what) unless the file is encoding/json's indented layout of
// the documented members with the checksum the documented rule gives.
func encodeAsDocumented(t *testing.T, claims map[types.UID]Claim, what string) []byte {
	t.Helper()
	data, err := encode(bootA, claims)
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.MarshalIndent(struct {
		Version  string              `json:"version"`
		BootID   string              `json:"bootID"`
		Checksum string              `json:"checksum"`
		Claims   map[types.UID]Claim `json:"claims"`
	}{CurrentVersion, bootA, "", claims}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatalf("%sencoded file is not JSON: %v\n%s", what, err, data)
	}
	sum, err := checksumOf(top)
	if err != nil {
		t.Fatal(err)
	}
	var gotSum string
	if err := json.Unmarshal(top["checksum"], &gotSum); err != nil || gotSum != sum {
		t.Fatalf("%schecksum %q, documented rule gives %q", what, gotSum, sum)
	}
	want = append([]byte(stringsReplaceChecksum(string(want), sum)), '\n')
	if diff := cmp.Diff(string(want), string(data)); diff != "" {
		t.Fatalf("%slayout (-MarshalIndent +encode):\n%s", what, diff)
	}
	return data
}

func stringsReplaceChecksum(doc, sum string) string {
	b, _ := json.Marshal(sum)
	return strings.Replace(doc, `"checksum": ""`, `"checksum": `+string(b), 1)
}

// TestDeviceFieldsRoundTrip: every Device field, the admin-access flag and
// the consumed capacity included, survives encode and decode, and a restart.
func TestDeviceFieldsRoundTrip(t *testing.T) {
	c := Claim{
		UID: "a", Namespace: "ml", Name: "mixed", State: PrepareCompleted,
		Devices: []Device{
			{Request: "gpus", Pool: "node-a", Device: "gpu-3-shared", ShareID: "s1", UUID: "GPU-3", Minor: 3,
				Isolation: "MPS", MemoryLimit: 8 << 30, CoresLimit: 30, CDIDeviceIDs: []string{"gpu.tessera.dev/gpu=a-1"},
				ConsumedMemory: 10 << 30, ConsumedCores: 40},
			{Request: "debug", Pool: "node-a", Device: "gpu-5", UUID: "GPU-5", Minor: 5,
				CDIDeviceIDs: []string{"gpu.tessera.dev/gpu=a-2"}, AdminAccess: true},
		},
	}
	data, err := encode(bootA, map[types.UID]Claim{"a": c})
	if err != nil {
		t.Fatal(err)
	}
	for _, member := range []string{`"adminAccess": true`, `"consumedMemory": 10737418240`, `"consumedCores": 40`} {
		if !strings.Contains(string(data), member) {
			t.Errorf("encoded file lacks %s:\n%s", member, data)
		}
	}
	got, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, got.Claims["a"]); diff != "" {
		t.Fatalf("decode(encode(x)) (-x +got):\n%s", diff)
	}

	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f, _ := mustOpen(t, path, bootA, osFS{})
	if err := f.Put(c); err != nil {
		t.Fatal(err)
	}
	g, _ := mustOpen(t, path, bootA, osFS{})
	if diff := cmp.Diff([]Claim{c}, g.List()); diff != "" {
		t.Fatalf("after reopen (-put +got):\n%s", diff)
	}
}

// TestPodsRoundTrip: a claim's reserving pods survive encode, decode and a
// restart; a claim without them is written without the member, exactly as
// a release before it wrote the claim, and reads back without pods (not
// known), as the claims of testdata/v1.json do (TestV1FixtureAlwaysLoads).
func TestPodsRoundTrip(t *testing.T) {
	with := testClaim("a", PrepareCompleted)
	with.Pods = []types.UID{"0b5a9c1e-77aa-4d0e-9a55-3f1c2d4e5f60", "1c6b0d2f-88bb-4e1f-0b66-4a2d3e5f6071"}
	without := testClaim("b", PrepareCompleted)
	data, err := encode(bootA, map[types.UID]Claim{"a": with, "b": without})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), `"pods": [`); n != 1 {
		t.Errorf("encoded file has %d pods members, want 1 (claim a's):\n%s", n, data)
	}
	got, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(with.Pods, got.Claims["a"].Pods); diff != "" {
		t.Errorf("claim a's pods after decode (-put +got):\n%s", diff)
	}
	if p := got.Claims["b"].Pods; p != nil {
		t.Errorf("claim b has pods %q after decode, want none", p)
	}

	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f, _ := mustOpen(t, path, bootA, osFS{})
	if err := f.Put(with); err != nil {
		t.Fatal(err)
	}
	g, _ := mustOpen(t, path, bootA, osFS{})
	if c, _ := g.Get("a"); !slices.Equal(c.Pods, with.Pods) {
		t.Errorf("after reopen: pods %q, want %q", c.Pods, with.Pods)
	}
}

// TestEncodeFromMatchesMarshalIndent checks the piecewise encoder against
// encoding/json for claim sets of every size the layout distinguishes, with
// keys whose order or escaping could differ (HTML characters, non-ASCII,
// prefixes of each other).
func TestEncodeFromMatchesMarshalIndent(t *testing.T) {
	uids := []string{"", "a", "ab", "a<b", "a&b", "Z", "é", "日本", "a\u2028b", "0"}
	for n := 0; n <= len(uids); n++ {
		claims := map[types.UID]Claim{}
		for _, uid := range uids[:n] {
			if uid == "" {
				continue
			}
			c := mustNormalize(t, testClaim(uid, PrepareCompleted))
			c.Name = "name " + uid + " <&>"
			claims[c.UID] = c
		}
		data := encodeAsDocumented(t, claims, fmt.Sprintf("%d claims: ", len(claims)))
		if _, err := decode(data); err != nil {
			t.Fatalf("%d claims: %v", len(claims), err)
		}
	}
}

// A File re-encodes only the claims a write changes; what it writes is
// still exactly what encoding every claim gives, also after a Refresh
// replaced its claims with another instance's.
func TestFileWritesTheFullEncoding(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f, _ := mustOpen(t, path, bootA, osFS{})
	other, _ := mustOpen(t, path, bootA, osFS{})
	check := func(when string) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want, err := encode(bootA, toMap(f.List()))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), string(data)); diff != "" {
			t.Fatalf("%s: file differs from encoding all claims (-want +got):\n%s", when, diff)
		}
	}
	for _, uid := range []string{"b", "a", "c"} {
		if err := f.Put(testClaim(uid, PrepareStarted)); err != nil {
			t.Fatal(err)
		}
	}
	check("after three Puts")
	if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete("b"); err != nil {
		t.Fatal(err)
	}
	check("after a replace and a Delete")
	if _, err := other.Refresh(); err != nil {
		t.Fatal(err)
	}
	c := testClaim("a", PrepareCompleted)
	c.Name = "changed by the other instance"
	if err := other.Put(c); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh = %v, %v; want true, nil", changed, err)
	}
	if err := f.Put(testClaim("d", PrepareStarted)); err != nil {
		t.Fatal(err)
	}
	check("after a Refresh and a Put")
	if got, _ := f.Get("a"); got.Name != c.Name {
		t.Errorf("claim a is named %q, want the other instance's %q", got.Name, c.Name)
	}
}
