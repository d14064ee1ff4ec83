package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two plugin instances share the checkpoint during a rolling update. Their calls
// are serialized, and each refreshes before it changes anything, so no instance
// writes back a stale copy over the other's entries.
func TestRefreshSeesTheOtherInstance(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	old, _, err := Open(ctx, path, "boot")
	if err != nil {
		t.Fatal(err)
	}
	surge, _, err := Open(ctx, path, "boot")
	if err != nil {
		t.Fatal(err)
	}

	if changed, err := surge.Refresh(); err != nil || changed {
		t.Fatalf("Refresh with nothing new = %v, %v; want false, nil", changed, err)
	}
	// The old instance finishes a prepare after the new one opened the file.
	if err := old.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if changed, err := surge.Refresh(); err != nil || !changed {
		t.Fatalf("Refresh after the other instance wrote = %v, %v; want true, nil", changed, err)
	}
	if _, ok := surge.Get("a"); !ok {
		t.Fatal("the new instance does not see claim a after Refresh")
	}
	if err := surge.Put(testClaim("b", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}

	// A third process reads the file: both claims are there.
	reader, _, err := Open(ctx, path, "boot")
	if err != nil {
		t.Fatal(err)
	}
	if got := uidList(reader.List()); got != "a,b" {
		t.Errorf("file holds claims %s, want a,b", got)
	}
	if changed, err := old.Refresh(); err != nil || !changed {
		t.Fatalf("old.Refresh = %v, %v; want true, nil", changed, err)
	}
	if got := uidList(old.List()); got != "a,b" {
		t.Errorf("old instance holds %s after Refresh, want a,b", got)
	}
}

func TestRefreshKeepsStateWhenTheFileIsUnreadable(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	f, _, err := Open(ctx, path, "boot")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = f.Refresh()
	if err == nil || !strings.Contains(err.Error(), "another writer left it unreadable") {
		t.Fatalf("Refresh of a garbled file: err = %v, want 'another writer left it unreadable'", err)
	}
	if _, ok := f.Get("a"); !ok {
		t.Error("Refresh dropped claim a after failing")
	}

	// A vanished file is written again from memory.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Refresh(); err != nil || changed {
		t.Fatalf("Refresh of a vanished file = %v, %v; want false, nil", changed, err)
	}
	again, _, err := Open(ctx, path, "boot")
	if err != nil {
		t.Fatal(err)
	}
	if got := uidList(again.List()); got != "a" {
		t.Errorf("rewritten file holds %q, want a", got)
	}
}

func uidList(claims []Claim) string {
	var s []string
	for _, c := range claims {
		s = append(s, string(c.UID))
	}
	return strings.Join(s, ",")
}
