package plugin

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Work on one claim is serialized; work on another claim never waits for
// it; a lock nobody holds or waits for is forgotten.
func TestClaimLocks(t *testing.T) {
	var l claimLocks
	unlockA := l.lock("a")
	// Another claim locks at once while a is held.
	unlockB := l.lock("b")
	unlockB()

	got := make(chan struct{})
	go func() {
		unlock := l.lock("a")
		close(got)
		unlock()
	}()
	// The second locker of a must be waiting: it registered as a user.
	deadline := time.Now().Add(30 * time.Second)
	for users(&l, "a") != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the second locker of claim a never queued")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-got:
		t.Fatal("claim a locked twice at once")
	default:
	}
	unlockA()
	<-got
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.locks) != 0 {
		t.Errorf("%d locks left after every holder unlocked, want 0", len(l.locks))
	}
}

func users(l *claimLocks, uid types.UID) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.locks[uid]; m != nil {
		return m.users
	}
	return 0
}
