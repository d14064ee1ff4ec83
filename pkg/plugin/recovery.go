package plugin

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
)

// recover brings the node in line with the checkpoint at start:
//  1. it logs what opening the checkpoint found and, when claims may have
//     been lost (corrupt file, reboot), emits a Warning event on the Node;
//  2. it rebuilds the double-grant index and the MPS holder sets from the
//     checkpoint (restarting held daemons, stopping orphaned ones);
//  3. it rolls back claims left PrepareStarted by a crash (the kubelet never
//     got their devices, so nothing uses them; its retry prepares afresh);
//  4. it removes CDI specs of claims the checkpoint does not hold.
//
// Every failure is logged (and reported as an event) and recovery goes on:
// a plugin that refuses to start cannot unprepare anything either.
func (p *Plugin) recover(ctx context.Context) {
	logger := klog.FromContext(ctx)
	r := p.opts.Recovery
	switch {
	case r.LostClaims():
		logger.Error(nil, "Checkpoint recovered with loss", "kind", r.Kind, "message", r.Message, "backup", r.BackupPath, "dropped", len(r.Dropped))
		p.event(corev1.EventTypeWarning, "CheckpointRecovered", fmt.Sprintf("%s (kind %s)", r.Message, r.Kind))
	case r.Kind != "" && r.Kind != checkpoint.RecoveryNone:
		logger.Info("Checkpoint recovered", "kind", r.Kind, "message", r.Message)
	}

	p.rebuildHolds(ctx)
	claims := p.opts.Store.List()

	for _, c := range claims {
		if c.State != checkpoint.PrepareStarted {
			continue
		}
		if err := p.rollback(ctx, c); err != nil {
			logger.Error(err, "Rolling back unfinished prepare failed", "claim", c.String())
			p.event(corev1.EventTypeWarning, "RollbackFailed", fmt.Sprintf("claim %s: %v", c, err))
			continue
		}
		logger.Info("Rolled back unfinished prepare from before restart", "claim", c.String())
	}

	specs, err := p.opts.Specs.List()
	if err != nil {
		logger.Error(err, "Listing CDI specs failed; stale specs are not removed")
		return
	}
	for _, uid := range specs {
		if _, ok := p.opts.Store.Get(uid); ok {
			continue
		}
		if err := p.opts.Specs.Remove(uid); err != nil {
			logger.Error(err, "Removing stale CDI spec failed", "claimUID", uid)
			continue
		}
		logger.Info("Removed CDI spec of a claim not in the checkpoint", "claimUID", uid)
	}
}

// rebuildHolds makes the double-grant index and the MPS holder sets mirror the
// checkpoint: at start, and when another plugin instance (a rolling update's
// other pod) changed the checkpoint. Daemons of GPUs with holders are
// (re)started, orphaned ones stopped.
func (p *Plugin) rebuildHolds(ctx context.Context) {
	logger := klog.FromContext(ctx)
	p.grants.reset()
	claims := p.opts.Store.List()
	holders := map[string][]types.UID{}
	for _, c := range claims {
		var reqs []grantRequest
		for _, d := range c.Devices {
			reqs = append(reqs, grantRequest{minor: d.Minor, shared: d.ShareID != ""})
		}
		if err := p.grants.reserve(c.UID, c.String(), reqs); err != nil {
			// Two checkpointed claims on one GPU: keep both prepared (their
			// containers may run) but say so loudly.
			logger.Error(err, "Checkpoint holds conflicting claims", "claim", c.String())
			p.event(corev1.EventTypeWarning, "DoubleGrant", err.Error())
		}
		for _, uuid := range mpsGPUs(c) {
			holders[uuid] = append(holders[uuid], c.UID)
		}
	}
	if p.opts.MPS != nil {
		if err := p.opts.MPS.Restore(ctx, holders); err != nil {
			logger.Error(err, "Restoring MPS daemons failed")
			p.event(corev1.EventTypeWarning, "MPSRestoreFailed", err.Error())
		}
	}
}

// refresh picks up what another plugin instance wrote to the checkpoint since
// this one last looked. The kubelet plugin helper serializes prepare and
// unprepare calls across instances with a file lock, so refreshing at the start
// of each call is enough for the two pods of a rolling update to never undo
// each other's work.
func (p *Plugin) refresh(ctx context.Context) error {
	changed, err := p.opts.Store.Refresh()
	if err != nil {
		return err
	}
	if changed {
		klog.FromContext(ctx).Info("Checkpoint changed by another plugin instance, rebuilding holds")
		p.rebuildHolds(ctx)
	}
	return nil
}

func (p *Plugin) event(eventType, reason, message string) {
	if p.opts.Events != nil {
		p.opts.Events.Event(eventType, reason, message)
	}
}
