package plugin

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
)

// staleCheckTimeout bounds all the API calls of one releaseStale: it runs
// inside the helper's lock, which every prepare and unprepare on the node
// waits for, within the kubelet's deadline for the call.
const staleCheckTimeout = 5 * time.Second

// releaseStale unprepares those of holders (claims in the way of a prepare)
// that the API server no longer has with the allocation they were prepared
// for, and returns how many it released. A pod deleted with
// --force --grace-period=0 leaves its claims prepared until the kubelet gets
// round to unpreparing them (about 90 s); meanwhile the scheduler may have
// given their GPUs to a new claim. Holders that still exist, or whose state
// cannot be read, or on whose GPUs compute processes still run (a
// force-deleted pod's containers may still be ending), are kept: the refusal
// stands.
func (p *Plugin) releaseStale(ctx context.Context, holders []types.UID) int {
	logger := klog.FromContext(ctx)
	apiCtx, cancel := context.WithTimeout(ctx, staleCheckTimeout)
	defer cancel()
	released := 0
	for _, uid := range holders {
		c, ok := p.opts.Store.Get(uid)
		if !ok {
			continue
		}
		why := p.holderGone(apiCtx, c)
		if why == "" {
			continue
		}
		if busy := p.busyGPUs(c); busy != "" {
			// The claim is gone, but a force-deleted pod's processes may
			// still be ending on the GPU: wait for the kubelet.
			logger.Info("Not releasing a gone claim while processes run on its GPUs", "claim", c.String(), "reason", why, "busy", busy)
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
	if p.opts.Client == nil || ctx.Err() != nil {
		return ""
	}
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

// busyGPUs names the GPUs of c on which compute processes run (or whose
// processes cannot be read), "" if none.
func (p *Plugin) busyGPUs(c checkpoint.Claim) string {
	if p.opts.Processes == nil {
		return ""
	}
	var busy []string
	seen := map[string]bool{}
	for _, d := range c.Devices {
		if seen[d.UUID] {
			continue
		}
		seen[d.UUID] = true
		n, err := p.opts.Processes(d.UUID)
		switch {
		case err != nil:
			busy = append(busy, fmt.Sprintf("%s (%v)", d.UUID, err))
		case n > 0:
			busy = append(busy, fmt.Sprintf("%s (%d processes)", d.UUID, n))
		}
	}
	return strings.Join(busy, ", ")
}
