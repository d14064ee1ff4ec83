package plugin

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
)

// recover brings the node in line with the checkpoint at start:
//  1. it logs what opening the checkpoint found and, when claims may have
//     been lost (corrupt file, reboot), emits a Warning event on the Node;
//  2. if the checkpoint was corrupt, its emptiness says nothing about what
//     is prepared: the entries are rebuilt from the records kept in the CDI
//     specs on disk, and nothing is cleaned up on the grounds that the
//     checkpoint lacks it (containers of those claims may be running);
//  3. it rebuilds the double-grant index and the MPS holder sets from the
//     checkpoint (restarting held daemons, stopping orphaned ones);
//  4. it rolls back claims left PrepareStarted by a crash (the kubelet never
//     got their devices, so nothing uses them; its retry prepares afresh);
//  5. it removes CDI specs of claims the checkpoint does not hold.
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
	// Cleaning up is safe only when the checkpoint knows every prepared claim.
	trusted := true
	if r.Untrusted() {
		trusted = p.rebuildFromSpecs(ctx)
	}

	p.rebuildHolds(ctx, trusted)
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

	if !trusted {
		logger.Error(nil, "Not removing CDI specs or MPS daemons: the checkpoint was lost and not every spec could be adopted; they go when the kubelet unprepares their claims")
		return
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

// rebuildFromSpecs puts the claim record kept in every CDI spec on disk back
// into the checkpoint, and reports whether every spec was adopted (only then
// is the rebuilt checkpoint complete).
func (p *Plugin) rebuildFromSpecs(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	uids, err := p.opts.Specs.List()
	if err != nil {
		logger.Error(err, "Listing CDI specs to rebuild the checkpoint failed")
		p.event(corev1.EventTypeWarning, "CheckpointRebuildFailed", err.Error())
		return false
	}
	adopted, complete := 0, true
	for _, uid := range uids {
		if _, ok := p.opts.Store.Get(uid); ok {
			continue
		}
		c, err := p.specRecord(uid)
		if err == nil {
			err = p.opts.Store.Put(c)
		}
		if err != nil {
			logger.Error(err, "Adopting a CDI spec into the checkpoint failed", "claimUID", uid)
			complete = false
			continue
		}
		adopted++
		logger.Info("Rebuilt checkpoint entry from its CDI spec", "claim", c.String())
	}
	msg := fmt.Sprintf("rebuilt %d of %d claims from the CDI specs in the checkpoint", adopted, len(uids))
	if !complete {
		msg += "; specs without a usable record are kept until the kubelet unprepares their claims"
	}
	p.event(corev1.EventTypeWarning, "CheckpointRebuilt", msg)
	return complete
}

// specRecord decodes the claim record kept in the claim's CDI spec.
func (p *Plugin) specRecord(uid types.UID) (checkpoint.Claim, error) {
	raw, err := p.opts.Specs.Record(uid)
	if err != nil {
		return checkpoint.Claim{}, err
	}
	if raw == nil {
		return checkpoint.Claim{}, fmt.Errorf("spec of claim %s has no %s annotation (written by an older Tessera)", uid, cdi.RecordAnnotation)
	}
	var c checkpoint.Claim
	if err := json.Unmarshal(raw, &c); err != nil {
		return checkpoint.Claim{}, fmt.Errorf("spec of claim %s: decode record: %w", uid, err)
	}
	if c.UID != uid || c.State != checkpoint.PrepareCompleted || len(c.Devices) == 0 {
		return checkpoint.Claim{}, fmt.Errorf("spec of claim %s: record is for claim %q in state %q with %d devices", uid, c.UID, c.State, len(c.Devices))
	}
	return c, nil
}

// rebuildHolds makes the double-grant index and the MPS holder sets mirror the
// checkpoint: at start, and when another plugin instance (a rolling update's
// other pod) changed the checkpoint. Daemons of GPUs with holders are
// (re)started; orphaned ones are stopped only when stopOrphans is set (the
// checkpoint is known to be complete).
func (p *Plugin) rebuildHolds(ctx context.Context, stopOrphans bool) {
	logger := klog.FromContext(ctx)
	p.grants.reset()
	claims := p.opts.Store.List()
	holders := map[string][]types.UID{}
	for _, c := range claims {
		if err := p.grants.restore(c.UID, c.String(), grantRequests(c), p.memoryOf); err != nil {
			// Two checkpointed claims on one GPU: keep both prepared (their
			// containers may run) but say so loudly.
			logger.Error(err, "Checkpoint holds conflicting claims", "claim", c.String())
			p.event(corev1.EventTypeWarning, "DoubleGrant", err.Error())
		}
		for _, uuid := range mpsGPUs(c) {
			holders[uuid] = append(holders[uuid], c.UID)
		}
	}
	if p.opts.MPS == nil {
		return
	}
	if !stopOrphans {
		for uuid, uids := range holders {
			for _, uid := range uids {
				if _, err := p.opts.MPS.Acquire(ctx, uuid, uid); err != nil {
					logger.Error(err, "Restarting MPS daemon failed", "gpu", uuid)
				}
			}
		}
		return
	}
	if err := p.opts.MPS.Restore(ctx, holders); err != nil {
		logger.Error(err, "Restoring MPS daemons failed")
		p.event(corev1.EventTypeWarning, "MPSRestoreFailed", err.Error())
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
		p.rebuildHolds(ctx, true)
	}
	return nil
}

func (p *Plugin) event(eventType, reason, message string) {
	if p.opts.Events != nil {
		p.opts.Events.Event(eventType, reason, message)
	}
}

func (p *Plugin) claimEvent(claim *resourceapi.ResourceClaim, eventType, reason, message string) {
	if p.opts.Events != nil {
		p.opts.Events.ClaimEvent(claim, eventType, reason, message)
	}
}
