package caller

import (
	"context"
	"testing"
)

func TestVerified(t *testing.T) {
	if _, ok := Verified(context.Background()); ok {
		t.Fatal("a bare context reports a verified caller")
	}
	name, ok := Verified(WithVerified(context.Background(), "kube-apiserver"))
	if !ok || name != "kube-apiserver" {
		t.Fatalf("Verified = %q, %v; want kube-apiserver, true", name, ok)
	}
}
