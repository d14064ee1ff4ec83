package plugin

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
)

// staleCheckTimeout bounds the API call that asks whether a holder is gone.
const staleCheckTimeout = 10 * time.Second

// releaseStale unprepares those of holders (claims in the way of a prepare)
// that the API server no longer has with the allocation they were prepared
// for, and returns how many it released. A pod deleted with
// --force --grace-period=0 leaves its claims prepared until the kubelet gets
// round to unpreparing them (about 90 s); meanwhile the scheduler may have
// given their GPUs to a new claim. Holders that still exist, or whose state
// cannot be read, are kept: the refusal stands.
func (p *Plugin) releaseStale(ctx context.Context, holders []types.UID) int {
	logger := klog.FromContext(ctx)
	released := 0
	for _, uid := range holders {
		c, ok := p.opts.Store.Get(uid)
		if !ok {
			continue
		}
		why := p.holderGone(ctx, c)
		if why == "" {
			continue
		}
		if err := p.unprepareClaim(ctx, uid); err != nil {
			logger.Error(err, "Releasing a stale claim failed", "claim", c.String(), "reason", why)
			continue
		}
		msg := fmt.Sprintf("released claim %s: %s (its pod was probably force-deleted before the kubelet unprepared it)", c, why)
		logger.Info("Released stale claim", "claim", c.String(), "reason", why)
		p.event(corev1.EventTypeNormal, "StaleClaimReleased", msg)
		released++
	}
	return released
}

// holderGone says why the checkpointed claim c no longer holds its devices
// according to the API server, or "" if it still does (or nobody can tell).
func (p *Plugin) holderGone(ctx context.Context, c checkpoint.Claim) string {
	if p.opts.Client == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, staleCheckTimeout)
	defer cancel()
	claim, err := p.opts.Client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "it no longer exists"
	case err != nil:
		klog.FromContext(ctx).V(2).Info("Cannot tell whether a conflicting claim is gone", "claim", c.String(), "err", err)
		return ""
	case claim.UID != c.UID:
		return fmt.Sprintf("it was deleted and created again (uid now %s)", claim.UID)
	case claim.Status.Allocation == nil:
		return "it is no longer allocated"
	}
	for _, d := range c.Devices {
		found := false
		for _, r := range claim.Status.Allocation.Devices.Results {
			share := ""
			if r.ShareID != nil {
				share = string(*r.ShareID)
			}
			if r.Pool == d.Pool && r.Device == d.Device && share == d.ShareID {
				found = true
				break
			}
		}
		if !found {
			return fmt.Sprintf("its allocation no longer contains device %s", d.Device)
		}
	}
	return ""
}
