package locality

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Election is the coordination.k8s.io Lease that makes one Controller the
// only writer of verdicts.
type Election struct {
	// Namespace and Name of the Lease; Identity of this replica (its pod name).
	Namespace, Name, Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod as in client-go's
	// leaderelection; zero: 15 s, 10 s and 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// ErrLostLease is returned by RunLeader when this replica stopped leading.
var ErrLostLease = errors.New("lost the locality controller's lease")

// RunLeader runs the controller while this replica holds the lease. A
// replica that loses the lease returns ErrLostLease at once rather than
// competing again: its ledger may miss verdicts written by the next leader,
// so the process exits and starts over with a fresh one. A leader stops
// writing at RenewDeadline after its last renewal, which is before another
// replica can take the lease (LeaseDuration); that margin is what keeps two
// leaders from writing at once. With ctx done it gives the lease up and
// returns nil.
func RunLeader(ctx context.Context, client kubernetes.Interface, e Election, c *Controller) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	orDefault := func(d, def time.Duration) time.Duration {
		if d == 0 {
			return def
		}
		return d
	}
	logger := klog.FromContext(ctx)
	ran := make(chan error, 1)
	leaderCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	leaderelection.RunOrDie(leaderCtx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   orDefault(e.LeaseDuration, 15*time.Second),
		RenewDeadline:   orDefault(e.RenewDeadline, 10*time.Second),
		RetryPeriod:     orDefault(e.RetryPeriod, 2*time.Second),
		ReleaseOnCancel: true,
		Name:            e.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				logger.Info("Leading: judging locality", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
				ran <- c.Run(ctx, client)
				cancel()
			},
			OnStoppedLeading: func() {},
		},
	})
	// RunOrDie returns when the lease is lost or ctx ends, without waiting
	// for Run: the caller exits, and Run with it.
	select {
	case err := <-ran:
		if err != nil {
			return err
		}
	default:
	}
	if ctx.Err() != nil {
		return nil
	}
	return ErrLostLease
}
