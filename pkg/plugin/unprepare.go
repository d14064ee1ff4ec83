package plugin

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin; see the package
// documentation for the contract. It needs nothing but the checkpoint; claims
// it does not know are already unprepared.
func (p *Plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	if err := p.refresh(ctx); err != nil {
		return nil, fmt.Errorf("unprepare: %w", err)
	}
	for _, claim := range claims {
		start := time.Now()
		err := p.unprepareClaim(ctx, claim.UID)
		p.opts.Metrics.ObserveUnprepare(time.Since(start), err)
		if err != nil {
			err = fmt.Errorf("claim %s/%s (uid %s): unprepare: %w", claim.Namespace, claim.Name, claim.UID, err)
			klog.FromContext(ctx).Error(err, "Unprepare failed")
			result[claim.UID] = err
			continue
		}
		result[claim.UID] = nil
	}
	return result, nil
}

func (p *Plugin) unprepareClaim(ctx context.Context, uid types.UID) error {
	// After the claim is gone: an owner leaving takes a lent GPU back.
	defer p.lendingChanged()
	unlock := p.lockClaim(uid)
	defer unlock()
	c, ok := p.opts.Store.Get(uid)
	p.forgetClaim(uid)
	if !ok {
		// Not prepared, or unprepared before; a stray spec (from a crash
		// before the first checkpoint write) goes too, and so do holds an
		// earlier failed rollback may have left behind.
		p.grants.release(uid)
		if p.opts.MPS != nil {
			if err := p.opts.MPS.ReleaseClaim(ctx, uid); err != nil {
				return err
			}
		}
		return p.opts.Specs.Remove(uid)
	}
	if err := p.rollback(ctx, c); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Unprepared claim", "claim", c.String())
	return nil
}
