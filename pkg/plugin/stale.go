package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/lending"
)

// staleCheckTimeout bounds all the API calls of one releaseStale: it runs
// inside the helper's lock, which every prepare and unprepare on the node
// waits for, within the kubelet's deadline for the call.
const staleCheckTimeout = 5 * time.Second

// releaseStale unprepares those of holders (claims in the way of a prepare)
// that the API server no longer has with the allocation they were prepared
// for and whose pods are all gone from the node. It returns how many it
// released, and for each gone claim it kept, why.
//
// A pod deleted with --force --grace-period=0 leaves its claims prepared
// until the kubelet gets round to unpreparing them, while the scheduler may
// already have given their GPUs to a new claim. The pod's containers,
// though, go on running for the pod's termination grace (the kubelet kills
// them with it; a process that ignores SIGTERM runs all of it), each with
// the GPU's device node: releasing then would put two pods on one exclusive
// GPU. So a gone claim is released only when no cgroup of the pods recorded
// at its prepare (checkpoint.Claim.Pods) remains under PodCgroupRoot, in the
// kubelet's layouts (lending.PodDirs): a cgroup cannot be removed while a
// process is in it, and a container cannot leave its pod's cgroup. An
// empty GPU (no compute process) proves nothing on its own: a container
// may simply have none at this instant.
//
// The safe rule where the pods cannot be checked is to keep the claim
// until the kubelet unprepares it, which it does only after the pods'
// containers stopped: a record without pods (a claim shared between pods,
// whose later pods the kubelet never prepares for; a record of an older
// release), no PodCgroupRoot, a node without kubelet pod cgroups
// (cgroupsPerQOS: false) or an unreadable cgroup tree. The refusal then
// stands, a little longer than needed at worst; nothing on the node can
// tell that no container uses the claim's GPUs.
//
// The plugin waits for the pods rather than killing them (cgroup.kill, as
// lending kills borrowers): their owner chose the grace, the kubelet is
// already ending them within it, and the new claim's pod only waits, with
// the reason in its claim's PrepareFailed event. Holders that still exist,
// or whose state cannot be read, or on whose GPUs compute processes still
// run, are kept too.
func (p *Plugin) releaseStale(ctx context.Context, holders []types.UID) (released int, kept []string) {
	logger := klog.FromContext(ctx)
	apiCtx, cancel := context.WithTimeout(ctx, staleCheckTimeout)
	defer cancel()
	for _, uid := range holders {
		c, ok := p.opts.Store.Get(uid)
		if !ok {
			continue
		}
		why := p.holderGone(apiCtx, c)
		if why == "" {
			continue
		}
		if remains := p.podsRemain(c); remains != "" {
			logger.Info("Not releasing a gone claim while its pods may remain on the node", "claim", c.String(), "reason", why, "pods", remains)
			kept = append(kept, fmt.Sprintf("claim %s is gone (%s) but kept: %s", c, why, remains))
			continue
		}
		if busy := p.busyGPUs(c); busy != "" {
			logger.Info("Not releasing a gone claim while processes run on its GPUs", "claim", c.String(), "reason", why, "busy", busy)
			kept = append(kept, fmt.Sprintf("claim %s is gone (%s) but kept: processes run on its GPUs: %s", c, why, busy))
			continue
		}
		if err := p.unprepareClaim(ctx, uid); err != nil {
			logger.Error(err, "Releasing a stale claim failed", "claim", c.String(), "reason", why)
			continue
		}
		msg := fmt.Sprintf("released claim %s: %s, and no cgroup of its pods %s remains on the node (its pods were probably force-deleted before the kubelet unprepared it)", c, why, podList(c.Pods))
		logger.Info("Released stale claim", "claim", c.String(), "reason", why, "pods", c.Pods)
		p.event(corev1.EventTypeNormal, "StaleClaimReleased", msg)
		released++
	}
	return released, kept
}

// podsRemain says why the pods of c may still run on the node, "" when no
// cgroup of any of them remains. See releaseStale for the rule.
func (p *Plugin) podsRemain(c checkpoint.Claim) string {
	root := p.opts.PodCgroupRoot
	switch {
	case len(c.Pods) == 0:
		return "the pods that use it are not recorded (a claim shared between pods, or prepared by an older release): it is released when the kubelet unprepares it"
	case root == "":
		return "pod cgroups are not visible to the plugin (no pod cgroup root): it is released when the kubelet unprepares it"
	}
	kubepods, err := kubeletCgroups(root)
	switch {
	case err != nil:
		return fmt.Sprintf("its pods cannot be checked: %v", err)
	case len(kubepods) == 0:
		return fmt.Sprintf("no kubelet pod cgroup (kubepods, kubepods.slice) under %s, so whether its pods %s still run cannot be seen (a kubelet with cgroupsPerQOS: false?): it is released when the kubelet unprepares it", root, podList(c.Pods))
	}
	for _, pod := range c.Pods {
		for _, dir := range kubepods {
			dirs, err := lending.PodDirs(dir, pod)
			switch {
			case err != nil:
				return fmt.Sprintf("its pods cannot be checked: %v", err)
			case len(dirs) > 0:
				return fmt.Sprintf("pod %s still has cgroup %s on the node (its containers are still ending)", pod, dirs[0])
			}
		}
	}
	return ""
}

// kubeletCgroupDepth bounds the search for the kubelet's cgroups:
// <v1 controller or unified>/<custom --cgroup-root, up to two
// levels>/kubepods.
const kubeletCgroupDepth = 4

// kubeletCgroups returns the kubelet's top pod cgroups under root: every
// kubepods (cgroupfs driver) or kubepods.slice (systemd driver) directory,
// in a cgroup v2 hierarchy and in each v1 controller's. The pods' own
// cgroups are at most two levels below them (QoS class, pod).
func kubeletCgroups(root string) ([]string, error) {
	var out []string
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if depth > 0 && errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return fmt.Errorf("kubelet cgroups under %s: %w", root, err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue // v1's cpu,cpuacct links among them
			}
			path := filepath.Join(dir, e.Name())
			if e.Name() == "kubepods" || e.Name() == "kubepods.slice" {
				out = append(out, path)
				continue
			}
			if depth+1 < kubeletCgroupDepth {
				if err := walk(path, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// podList names pods for messages.
func podList(pods []types.UID) string {
	names := make([]string, len(pods))
	for i, pod := range pods {
		names[i] = string(pod)
	}
	return "[" + strings.Join(names, " ") + "]"
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
