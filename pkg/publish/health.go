package publish

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/health"
)

// FollowHealth makes inv sync after every change of the tracker's health, so
// taints appear in and vanish from the published ResourceSlices as GPUs turn
// unhealthy and recover. It returns when ctx is done.
func FollowHealth(ctx context.Context, tracker *health.Tracker, inv *Inventory) {
	changes, stop := tracker.Subscribe()
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			inv.Trigger()
		}
	}
}

// HealthTaints returns the Inventory.Taints of tracker: before each
// inventory sync it re-reads the tracker's state file (health.Tracker.Refresh;
// a tracker without one is only read), so that the faults the other
// instance of a surge rolling update recorded are published by this one too,
// within a --rediscover-interval at most.
func HealthTaints(tracker *health.Tracker) func() map[string][]resourceapi.DeviceTaint {
	return func() map[string][]resourceapi.DeviceTaint {
		tracker.Refresh()
		return tracker.Taints()
	}
}
