package checkpoint

import (
	"encoding/json"
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
		t.Fatalf("encoded file is not JSON: %v\n%s", err, data)
	}
	sum, err := checksumOf(top)
	if err != nil {
		t.Fatal(err)
	}
	var gotSum string
	if err := json.Unmarshal(top["checksum"], &gotSum); err != nil || gotSum != sum {
		t.Fatalf("checksum %q, documented rule gives %q", gotSum, sum)
	}
	want = append([]byte(stringsReplaceChecksum(string(want), sum)), '\n')
	if diff := cmp.Diff(string(want), string(data)); diff != "" {
		t.Fatalf("layout (-MarshalIndent +encode):\n%s", diff)
	}
	c, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(claims, c.Claims); diff != "" {
		t.Fatalf("decode(encode(x)) (-x +got):\n%s", diff)
	}
}

func stringsReplaceChecksum(doc, sum string) string {
	b, _ := json.Marshal(sum)
	return strings.Replace(doc, `"checksum": ""`, `"checksum": `+string(b), 1)
}
