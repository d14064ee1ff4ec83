package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/isolation"
)

// recover brings the node in line with the checkpoint at start:
//  1. it logs what opening the checkpoint found and, when claims may have
//     been lost (corrupt file, reboot), emits a Warning event on the Node;
//  2. unless the node rebooted, it adopts into the checkpoint every claim
//     whose CDI spec is on disk with its record but which the checkpoint
//     lacks (a corrupt or deleted checkpoint, or an earlier start that could
//     not finish this). A spec without a usable record is kept, never
//     deleted on the grounds that the checkpoint lacks it: its containers
//     may be running, and the kubelet's unprepare removes it;
//  3. it rebuilds the double-grant index and the MPS holder sets from the
//     checkpoint, restarting held daemons and, only when every spec on disk
//     is accounted for, stopping orphaned ones;
//  4. it rolls back claims left PrepareStarted by a crash (the kubelet never
//     got their devices, so nothing uses them; its retry prepares afresh);
//  5. it adopts the MIG instances of checkpointed claims and reports, once
//     each, the instances no record holds on dynamic-MIG GPUs, which it
//     keeps (reconcileMIG; only a record's rollback destroys an instance);
//  6. after a reboot (nothing prepared survives one), it removes the CDI
//     specs of claims the checkpoint does not hold.
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
	rebooted := r.Kind == checkpoint.RecoveryRebooted
	p.complete = rebooted || p.adoptSpecs(ctx, r.Untrusted())

	p.rebuildHolds(ctx, p.complete)
	for _, c := range p.opts.Store.List() {
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
	// After the rollbacks, which destroyed the instances of unfinished
	// prepares: what is left is adopted, or an orphan.
	p.reconcileMIG(ctx)
	p.ensureSpecs(ctx)
	if !rebooted {
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
			logger.Error(err, "Removing CDI spec from before the reboot failed", "claimUID", uid)
			continue
		}
		logger.Info("Removed CDI spec from before the reboot", "claimUID", uid)
	}
}

// adoptSpecs puts the record kept beside every CDI spec whose claim the
// checkpoint lacks back into the checkpoint, and reports whether every spec
// on disk is now accounted for. untrusted says the checkpoint was found
// corrupt: the outcome is then always reported.
func (p *Plugin) adoptSpecs(ctx context.Context, untrusted bool) bool {
	logger := klog.FromContext(ctx)
	uids, err := p.opts.Specs.List()
	if err != nil {
		logger.Error(err, "Listing CDI specs to rebuild the checkpoint failed")
		p.event(corev1.EventTypeWarning, "CheckpointRebuildFailed", err.Error())
		return false
	}
	var adopted int
	var kept []string
	for _, uid := range uids {
		if _, ok := p.opts.Store.Get(uid); ok {
			continue
		}
		c, err := p.specRecord(uid)
		if err == nil {
			err = p.opts.Store.Put(c)
		}
		if err != nil {
			logger.Error(err, "Adopting a CDI spec into the checkpoint failed; the spec is kept", "claimUID", uid)
			kept = append(kept, string(uid))
			continue
		}
		adopted++
		logger.Info("Rebuilt checkpoint entry from its CDI spec", "claim", c.String())
	}
	if adopted > 0 || len(kept) > 0 || untrusted {
		msg := fmt.Sprintf("adopted %d claims from their CDI specs into the checkpoint", adopted)
		if len(kept) > 0 {
			msg += fmt.Sprintf("; kept %d specs without a usable record (claims %s) until the kubelet unprepares them, and no MPS daemon is stopped meanwhile", len(kept), strings.Join(kept, ", "))
		}
		p.event(corev1.EventTypeWarning, "CheckpointRebuilt", msg)
	}
	return len(kept) == 0
}

// specRecord decodes the claim record kept in the claim's CDI spec.
func (p *Plugin) specRecord(uid types.UID) (checkpoint.Claim, error) {
	raw, err := p.opts.Specs.Record(uid)
	if err != nil {
		return checkpoint.Claim{}, err
	}
	if raw == nil {
		return checkpoint.Claim{}, fmt.Errorf("spec of claim %s has no record beside it (written by an older Tessera)", uid)
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
	holders := map[isolation.DaemonKey][]types.UID{}
	for _, c := range claims {
		if err := p.grants.restore(c.UID, c.String(), grantRequests(c), p.memoryOf); err != nil {
			// Two checkpointed claims on one GPU: keep both prepared (their
			// containers may run) but say so loudly.
			logger.Error(err, "Checkpoint holds conflicting claims", "claim", c.String())
			p.event(corev1.EventTypeWarning, "DoubleGrant", err.Error())
		}
		for _, key := range mpsDaemons(c) {
			holders[key] = append(holders[key], c.UID)
		}
	}
	if p.opts.MPS == nil {
		return
	}
	if err := p.opts.MPS.Restore(ctx, holders, stopOrphans); err != nil {
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
		p.rebuildHolds(ctx, p.complete)
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
