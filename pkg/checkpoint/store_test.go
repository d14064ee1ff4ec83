package checkpoint

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// testStoreContract checks what every Store promises, so that Memory stays a
// faithful stand-in for File.
func testStoreContract(t *testing.T, s Store) {
	t.Helper()
	for _, uid := range []string{"c", "a", "b"} {
		if err := s.Put(testClaim(uid, PrepareStarted)); err != nil {
			t.Fatalf("Put(%s): %v", uid, err)
		}
	}
	if diff := cmp.Diff([]types.UID{"a", "b", "c"}, uids(s.List())); diff != "" {
		t.Errorf("List not sorted by UID (-want +got):\n%s", diff)
	}

	// Returned values and Put arguments are copies.
	in := testClaim("d", PrepareCompleted)
	in.Pods = []types.UID{"pod-1"}
	if err := s.Put(in); err != nil {
		t.Fatal(err)
	}
	in.Devices[0].CDIDeviceIDs[0] = "mutated"
	in.Config[0] = ' '
	in.Pods[0] = "mutated"
	got, ok := s.Get("d")
	if !ok {
		t.Fatal("Get(d): missing")
	}
	if got.Devices[0].CDIDeviceIDs[0] == "mutated" || got.Config[0] != '{' || got.Pods[0] == "mutated" {
		t.Errorf("store aliases the caller's claim")
	}
	got.Pods[0] = "mutated"
	if again, _ := s.Get("d"); again.Pods[0] == "mutated" {
		t.Errorf("Get returns the stored pods, not a copy")
	}
	got.Devices[0].Device = "mutated"
	s.List()[0].Devices[0].Device = "mutated"
	if again, _ := s.Get("d"); again.Devices[0].Device == "mutated" {
		t.Errorf("Get returns the stored value, not a copy")
	}
	if a, _ := s.Get("a"); a.Devices[0].Device == "mutated" {
		t.Errorf("List returns the stored values, not copies")
	}

	// Invalid claims are refused and change nothing.
	bad := []Claim{
		{Namespace: "ns", Name: "no-uid", State: PrepareStarted},
		{UID: "x", State: "Prepared"},
		{UID: "y", State: PrepareStarted, Config: json.RawMessage(`{"broken"`)},
	}
	for _, c := range bad {
		if err := s.Put(c); err == nil {
			t.Errorf("Put(%+v) accepted", c)
		}
	}
	if len(s.List()) != 4 {
		t.Errorf("invalid Put changed the store: %v", uids(s.List()))
	}

	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get("a"); ok {
		t.Errorf("Get after Delete found the claim")
	}
	if err := s.Delete("a"); err != nil {
		t.Errorf("Delete of an unknown uid: %v", err)
	}
}

func TestStoreContract(t *testing.T) {
	t.Run("File", func(t *testing.T) {
		f, _ := mustOpen(t, filepath.Join(t.TempDir(), "checkpoint.json"), bootA, osFS{})
		testStoreContract(t, f)
	})
	t.Run("Memory", func(t *testing.T) {
		testStoreContract(t, NewMemory())
	})
}

func TestMemoryFailWrites(t *testing.T) {
	m := NewMemory()
	if err := m.Put(testClaim("a", PrepareCompleted)); err != nil {
		t.Fatal(err)
	}
	full := errors.New("disk full")
	m.FailWrites(full)
	if err := m.Put(testClaim("b", PrepareStarted)); !errors.Is(err, full) || !strings.Contains(err.Error(), "uid b") {
		t.Errorf("Put: got %v, want disk full naming the claim", err)
	}
	if err := m.Delete("a"); !errors.Is(err, full) {
		t.Errorf("Delete: got %v, want disk full", err)
	}
	if err := m.Delete("unknown"); err != nil {
		t.Errorf("Delete of an unknown uid writes nothing and cannot fail: %v", err)
	}
	if diff := cmp.Diff([]types.UID{"a"}, uids(m.List())); diff != "" {
		t.Errorf("failed writes changed the store (-want +got):\n%s", diff)
	}
	m.FailWrites(nil)
	if err := m.Put(testClaim("b", PrepareStarted)); err != nil {
		t.Errorf("Put after FailWrites(nil): %v", err)
	}
}
