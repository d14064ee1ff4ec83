//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The MIG tests run the plugin on the hgx-h100-mig mock profile: GPU 0 in
// MIG mode with the admin's instances 4g.40gb at slice 0 and 3g.40gb at
// slice 4 (static MIG), GPU 1 in MIG mode with no instances and published
// with dynamic MIG, GPUs 2-7 not in MIG mode. The mock keeps its instances
// in a state file in the plugin's data directory, so they outlive the
// plugin's process, as a node's do.
const (
	migProfile   = "hgx-h100-mig"
	migStateFile = "/var/lib/kubelet/plugins/gpu.tessera.dev/mock-mig-state-" + migProfile + ".json"
	migClass     = "mig.gpu.tessera.dev"
)

// migValues are the release values of the MIG tests; extra are merged into
// kubeletPlugin.
func migValues(extra map[string]any) map[string]any {
	plugin := map[string]any{"mockProfile": migProfile, "dynamicMIG": []any{"1"}}
	for k, v := range extra {
		plugin[k] = v
	}
	return map[string]any{"kubeletPlugin": plugin}
}

// migClaim is a claim template for one MIG device of this profile, with an
// optional opaque config (JSON).
func migClaim(name, profile, config string) *unstructured.Unstructured {
	return migClaimOn(name, profile, config, "")
}

// migClaimOn is migClaim on the GPU with this minor ("": any): GPU 0's
// static instances have profiles that GPU 1's placements have too.
func migClaimOn(name, profile, config, minor string) *unstructured.Unstructured {
	sel := fmt.Sprintf(`device.attributes["gpu.tessera.dev"].profile == "%s"`, profile)
	if minor != "" {
		sel += ` && device.attributes["gpu.tessera.dev"].minor == ` + minor
	}
	return framework.Claim{Name: name, Template: true, Class: migClass, Selectors: []string{sel}, Config: config}.Object()
}

// mockMIGState is the part of the mock's MIG state file the tests read.
type mockMIGState struct {
	Profile string `json:"profile"`
	GPUs    map[string]struct {
		Current   bool `json:"current"`
		Pending   bool `json:"pending"`
		Instances []struct {
			ID        int    `json:"id"`
			ProfileID uint32 `json:"profileID"`
			Start     uint32 `json:"start"`
		} `json:"instances"`
	} `json:"gpus"`
}

// migInstances are the GPU instances of mock GPU index, as "<profile
// ID>@<start>", from the state file.
func migInstances(t testing.TB, index string) []string {
	t.Helper()
	data, err := os.ReadFile(migStateFile)
	if err != nil {
		t.Fatalf("mock MIG state: %v", err)
	}
	var st mockMIGState
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("%s: %v", migStateFile, err)
	}
	var out []string
	for _, gi := range st.GPUs[index].Instances {
		out = append(out, fmt.Sprintf("%d@%d", gi.ProfileID, gi.Start))
	}
	slices.Sort(out)
	return out
}

// waitMIGInstances waits until GPU index has n GPU instances.
func waitMIGInstances(t testing.TB, index string, n int) []string {
	t.Helper()
	var got []string
	err := framework.Poll(context.Background(), fmt.Sprintf("GPU %s to have %d MIG instances", index, n), framework.PodTimeout, func(context.Context) (bool, error) {
		got = migInstances(t, index)
		return len(got) == n, nil
	})
	if err != nil {
		t.Fatalf("%v (has %v)", err, got)
	}
	return got
}

// waitDynamicPlacements waits until the driver publishes n devices whose
// names start with prefix, and returns their names.
func waitDynamicPlacements(c *framework.Cluster, t testing.TB, prefix string, n int) []string {
	t.Helper()
	var names []string
	err := framework.Poll(context.Background(), fmt.Sprintf("%d devices %s* to be published", n, prefix), framework.PodTimeout, func(ctx context.Context) (bool, error) {
		devices, err := publishedDevices(c, ctx)
		if err != nil {
			return false, err
		}
		names = names[:0]
		for name := range devices {
			if strings.HasPrefix(name, prefix) {
				names = append(names, name)
			}
		}
		return len(names) == n, nil
	})
	if err != nil {
		t.Fatalf("%v (publishes %d: %v)", err, len(names), names)
	}
	slices.Sort(names)
	return names
}

// publishedDevices are the names of the driver's published devices.
func publishedDevices(c *framework.Cluster, ctx context.Context) (map[string]resourceapi.Device, error) {
	published, err := c.DriverSlices(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]resourceapi.Device{}
	for _, s := range published {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out, nil
}

// staticMIG is GPU 0's static MIG device of this profile (zero if none is
// published).
func staticMIG(devices map[string]resourceapi.Device, profile string) resourceapi.Device {
	for name, d := range devices {
		if p := d.Attributes["profile"].StringValue; strings.HasPrefix(name, "gpu-0-mig-") && p != nil && *p == profile {
			return d
		}
	}
	return resourceapi.Device{}
}

// TestMIG: static MIG devices carry their instance; dynamic MIG creates the
// instance at prepare and fills a GPU with seven 1g.10gb (an eighth stays
// pending, and tessera why names the slices); 3g.40gb and 4g.40gb fit in
// either arrival order and two 4g.40gb never do; a MIG-mode GPU publishes no
// whole or shared device, and one with a pending mode change is tainted; a
// MIG claim asking for HAMiCore is refused at apply.
func TestMIG(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", migClass)
	framework.RequireNodeFiles(t)
	ctx := context.Background()
	framework.HelmValues(t, c, migValues(nil))

	// What the node publishes.
	var devices map[string]resourceapi.Device
	err := framework.Poll(ctx, "the MIG devices to be published", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		var err error
		devices, err = publishedDevices(c, ctx)
		_, dynamic := devices["gpu-1-mig-1g-10gb-6"]
		return err == nil && staticMIG(devices, "4g.40gb").Name != "" && dynamic, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpu-0", "gpu-0-shared", "gpu-1", "gpu-1-shared"} {
		if _, ok := devices[name]; ok {
			t.Errorf("a GPU in MIG mode publishes %s", name)
		}
	}
	for _, name := range []string{"gpu-2", "gpu-2-shared"} {
		if _, ok := devices[name]; !ok {
			t.Errorf("GPU 2 (not in MIG mode) does not publish %s", name)
		}
	}
	var dyn []string
	for name := range devices {
		if strings.HasPrefix(name, "gpu-1-mig-") {
			dyn = append(dyn, name)
		}
	}
	if len(dyn) != 25 {
		t.Errorf("dynamic GPU 1 publishes %d placements, want the H100's 25: %v", len(dyn), dyn)
	}
	t.Logf("published: GPU 0 static %v, GPU 1 %d placements", func() (s []string) {
		for name := range devices {
			if strings.HasPrefix(name, "gpu-0-") {
				s = append(s, name)
			}
		}
		slices.Sort(s)
		return s
	}(), len(dyn))

	t.Run("static", func(t *testing.T) {
		ns := c.Namespace(t, "e2e-mig-static")
		got := c.RunObjects(t, ns, migClaimOn("g4", "4g.40gb", "", "0"), framework.EnvPod("g4", "g4", true))["g4"]
		var uuid, profile, caps string
		for k, v := range got.Env {
			switch {
			case strings.HasPrefix(k, "TESSERA_MIG_0_") && strings.HasSuffix(k, "_PROFILE"):
				profile = v
			case strings.HasPrefix(k, "TESSERA_MIG_0_") && strings.HasSuffix(k, "_CAPS"):
				caps = v
			case strings.HasPrefix(k, "TESSERA_MIG_0_"):
				uuid = v
			}
		}
		static := staticMIG(devices, "4g.40gb")
		want := static.Attributes["uuid"]
		if profile != "4g.40gb" || !strings.HasPrefix(uuid, "MIG-") || got.Env["CUDA_VISIBLE_DEVICES"] != uuid ||
			!strings.HasPrefix(caps, "/dev/nvidia-caps/nvidia-cap") || strings.Count(caps, ",") != 1 {
			t.Fatalf("static 4g.40gb pod saw MIG device %q profile %q caps %q CUDA_VISIBLE_DEVICES %q; env %v",
				uuid, profile, caps, got.Env["CUDA_VISIBLE_DEVICES"], got.Env)
		}
		if want.StringValue != nil && *want.StringValue != uuid {
			t.Errorf("pod sees %s, %s publishes uuid %s", uuid, static.Name, *want.StringValue)
		}
		t.Logf("static: pod sees %s (%s), capability nodes %s", uuid, profile, caps)
	})

	t.Run("dynamic fill", func(t *testing.T) {
		ns := c.Namespace(t, "e2e-mig-fill")
		objs := []*unstructured.Unstructured{migClaim("g1", "1g.10gb", "")}
		for i := range 7 {
			objs = append(objs, framework.EnvPod(fmt.Sprintf("g1-%d", i), "g1", true))
		}
		start := time.Now()
		pods := c.RunObjects(t, ns, objs...)
		seen := map[string]bool{}
		for name, p := range pods {
			uuid := p.Env["CUDA_VISIBLE_DEVICES"]
			if !strings.HasPrefix(uuid, "MIG-") || seen[uuid] {
				t.Errorf("pod %s: CUDA_VISIBLE_DEVICES %q (seen: %v)", name, uuid, seen)
			}
			seen[uuid] = true
		}
		got := waitMIGInstances(t, "1", 7)
		t.Logf("seven 1g.10gb pods running in %v on seven instances %v", time.Since(start).Round(time.Second), got)
		// With its instances made the GPU is republished with only the
		// held placements and the full-GPU profile's (7 + 1).
		held := waitDynamicPlacements(c, t, "gpu-1-mig-", 8)
		if !slices.Contains(held, "gpu-1-mig-7g-80gb-0") {
			t.Errorf("GPU 1 republished without its full-GPU placement: %v", held)
		}
		t.Logf("GPU 1 republished with %d placements: %v", len(held), held)

		c.Apply(t, ns, framework.EnvPod("g1-7", "g1", true))
		if _, err := c.WaitForUnschedulable(ctx, ns, "g1-7"); err != nil {
			t.Fatal(err)
		}
		table := framework.RunCLI(t, "why", "g1-7", "-n", ns, "--kubeconfig", framework.Kubeconfig(t))
		t.Logf("tessera why g1-7:\n%s", table)
		for _, want := range []string{"memory slice", ns + "/"} {
			if !strings.Contains(table, want) {
				t.Errorf("tessera why g1-7: want %q in the explanation", want)
			}
		}
		for name := range pods {
			if err := c.DeletePodAndWait(ctx, ns, name); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.DeletePodAndWait(ctx, ns, "g1-7"); err != nil {
			t.Fatal(err)
		}
		waitMIGInstances(t, "1", 0)
		waitDynamicPlacements(c, t, "gpu-1-mig-", 25)
		t.Log("unprepare destroyed the seven instances")
	})

	// two runs the pods one after the other: the second arrives after the
	// first holds its instance.
	two := func(t *testing.T, first, second string, wantSecond bool) {
		ns := c.Namespace(t, "e2e-mig-two")
		a, b := "a-"+strings.ReplaceAll(first, ".", "-"), "b-"+strings.ReplaceAll(second, ".", "-")
		c.RunObjects(t, ns, migClaimOn(a, first, "", "1"), framework.EnvPod(a, a, true))
		c.Apply(t, ns, migClaimOn(b, second, "", "1"), framework.EnvPod(b, b, true))
		if wantSecond {
			if _, err := c.WaitForEnvPod(ctx, ns, b); err != nil {
				t.Fatalf("%s after %s: %v", second, first, err)
			}
			t.Logf("%s then %s: both run, instances %v", first, second, waitMIGInstances(t, "1", 2))
		} else {
			if _, err := c.WaitForUnschedulable(ctx, ns, b); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s then %s: the second stays pending, instances %v", first, second, migInstances(t, "1"))
		}
		for _, p := range []string{a, b} {
			if err := c.DeletePodAndWait(ctx, ns, p); err != nil {
				t.Fatal(err)
			}
		}
		waitMIGInstances(t, "1", 0)
	}
	t.Run("3g then 4g", func(t *testing.T) { two(t, "3g.40gb", "4g.40gb", true) })
	t.Run("4g then 3g", func(t *testing.T) { two(t, "4g.40gb", "3g.40gb", true) })
	t.Run("4g then 4g", func(t *testing.T) { two(t, "4g.40gb", "4g.40gb", false) })

	t.Run("HAMiCore refused at apply", func(t *testing.T) {
		ns := c.Namespace(t, "e2e-mig-hami")
		tmpl := migClaim("hami", "1g.10gb", `{"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"isolation": "HAMiCore"}}`)
		_, err := c.Dynamic.Resource(resourceapi.SchemeGroupVersion.WithResource("resourceclaimtemplates")).Namespace(ns).Create(ctx, tmpl, metav1.CreateOptions{})
		if err == nil {
			t.Fatal("a MIG claim template asking for HAMiCore was admitted")
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) && !apierrors.IsBadRequest(err) {
			t.Errorf("refused with %v, want the webhook's refusal", err)
		}
		for _, want := range []string{"sharing.isolation", "HAMiCore", "MIG"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q lacks %q", err, want)
			}
		}
		t.Logf("refused at apply: %v", err)
	})

	t.Run("pending mode taints", func(t *testing.T) {
		framework.PostMockKnob(t, "/mock/mig", url.Values{"gpu": {"2"}, "pending": {"true"}})
		t.Cleanup(func() { framework.PostMockKnob(t, "/mock/mig", url.Values{"gpu": {"2"}, "pending": {"false"}}) })
		err := framework.Poll(ctx, "GPU 2's devices to be tainted for the pending MIG mode", 3*time.Minute, func(ctx context.Context) (bool, error) {
			devs, err := publishedDevices(c, ctx)
			if err != nil {
				return false, err
			}
			for _, name := range []string{"gpu-2", "gpu-2-shared"} {
				d, ok := devs[name]
				if !ok || !slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return strings.Contains(t.Key+t.Value, "MIG") }) {
					return false, nil
				}
			}
			t.Logf("gpu-2 taints: %+v", devs["gpu-2"].Taints)
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// TestMIGCrashAfterCreate: the plugin is killed (SIGKILL, a failpoint)
// right after it created a dynamic MIG instance and before it recorded it.
// The restarted plugin finds the instance by the placement its checkpoint
// recorded as intent, destroys it, and the kubelet's retried prepare makes
// the claim's instance again: one instance while the pod runs, none after.
func TestMIGCrashAfterCreate(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", migClass)
	framework.RequireNodeFiles(t)
	ctx := context.Background()
	once := filepath.Join("/var/lib/kubelet/plugins/gpu.tessera.dev", fmt.Sprintf("e2e-failpoint-%d", time.Now().UnixNano()))
	t.Cleanup(func() { os.Remove(once) })
	framework.HelmValues(t, c, migValues(map[string]any{"extraEnv": []any{
		map[string]any{"name": "TESSERA_FAILPOINT", "value": "mig-after-create"},
		map[string]any{"name": "TESSERA_FAILPOINT_ONCE", "value": once},
	}}))
	waitMIGInstances(t, "1", 0)
	before, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	restarts := func(p *corev1.Pod) int32 {
		var n int32
		for _, s := range p.Status.ContainerStatuses {
			n += s.RestartCount
		}
		return n
	}
	ns := c.Namespace(t, "e2e-mig-crash")
	start := time.Now()
	c.Apply(t, ns, migClaimOn("g3", "3g.40gb", "", "1"), framework.EnvPod("g3", "g3", true))
	// The kubelet retries the killed prepare with its back-off (about a
	// minute here): allow three pod timeouts.
	var got framework.SpecPod
	for attempt := 1; ; attempt++ {
		if got, err = c.WaitForEnvPod(ctx, ns, "g3"); err == nil {
			break
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("pod g3 not running after %v: the kubelet retries the prepare with back-off", time.Since(start).Round(time.Second))
	}
	if _, err := os.Stat(once); err != nil {
		t.Fatalf("the failpoint did not fire: %v", err)
	}
	after, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Name == before.Name && restarts(after) <= restarts(before) {
		t.Errorf("plugin pod %s did not restart (restarts %d → %d)", after.Name, restarts(before), restarts(after))
	}
	// The restarted plugin found the instance the killed one made by the
	// intent its checkpoint recorded, and destroyed it before the retry.
	log, err := c.PodLog(ctx, after.Namespace, after.Name, "plugin")
	if err != nil {
		t.Fatal(err)
	}
	var rolledBack, destroyed bool
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, ns+"/") {
			continue
		}
		rolledBack = rolledBack || strings.Contains(line, "Rolled back unfinished prepare")
		destroyed = destroyed || (strings.Contains(line, "Destroyed MIG instance") && !strings.Contains(line, "NodeUnprepareResources"))
	}
	if !rolledBack || !destroyed {
		t.Errorf("the restarted plugin's log does not show the unfinished prepare rolled back (%v) and its instance destroyed (%v)", rolledBack, destroyed)
	}
	instances := migInstances(t, "1")
	if len(instances) != 1 {
		t.Fatalf("after the crash and the retried prepare: instances %v, want exactly the claim's", instances)
	}
	t.Logf("plugin killed after create; pod runs %v later on %s, GPU 1 instances %v", time.Since(start).Round(time.Second), got.Env["CUDA_VISIBLE_DEVICES"], instances)
	if err := c.DeletePodAndWait(ctx, ns, "g3"); err != nil {
		t.Fatal(err)
	}
	waitMIGInstances(t, "1", 0)
	t.Log("no orphan instance after unprepare")
}
