//go:build e2e

package e2e

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// Container paths of the HAMiCore backend (pkg/isolation).
const (
	hamiLibrary      = "/usr/local/vgpu/libvgpu.so"
	hamiPreload      = "/etc/ld.so.preload"
	hamiSharedDir    = "/tmp/vgpulock"
	hamiSharedRegion = hamiSharedDir + "/cudevshr.cache"
)

// pluginArgs returns the arguments of the Ready plugin pod's plugin container.
func pluginArgs(t *testing.T, c *framework.Cluster) []string {
	t.Helper()
	p, err := c.ReadyPluginPod(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, ctr := range p.Spec.Containers {
		if ctr.Name == "plugin" {
			return ctr.Args
		}
	}
	t.Fatalf("plugin pod %s has no container named plugin", p.Name)
	return nil
}

// currentExtraArgs is kubeletPlugin.extraArgs of the release as it is now.
func currentExtraArgs(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command(framework.HelmBinary(t), "get", "values", "-n", framework.InstallNamespace, framework.InstallRelease, "--all", "-o", "json").Output()
	if err != nil {
		t.Fatalf("helm get values --all: %v", err)
	}
	var v struct {
		KubeletPlugin struct {
			ExtraArgs []string `json:"extraArgs"`
		} `json:"kubeletPlugin"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("helm get values --all: %v\n%s", err, out)
	}
	return v.KubeletPlugin.ExtraArgs
}

// waitDriverMemoryAttribute waits until every device Tessera publishes
// carries driverMemoryLimits=want (after a plugin restart the new plugin
// republishes its slices).
func waitDriverMemoryAttribute(t *testing.T, c *framework.Cluster, want bool) {
	t.Helper()
	c.WaitForDevices(t, fmt.Sprintf("every device to publish driverMemoryLimits=%v", want), func(d resourceapi.Device) (bool, error) {
		if a, ok := d.Attributes["driverMemoryLimits"]; !ok || a.BoolValue == nil || *a.BoolValue != want {
			return false, fmt.Errorf("driverMemoryLimits %+v", a)
		}
		return true, nil
	})
}

// claimSpecDevice reads the claim's CDI spec from the node and returns its
// one device, checking the spec's kind.
func claimSpecDevice(t *testing.T, claimUID types.UID) cdispec.Device {
	t.Helper()
	path := framework.CDISpecPath(claimUID)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the claim's CDI spec: %v", err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if spec.Kind != "k8s.gpu.tessera.dev/claim" || len(spec.Devices) != 1 {
		t.Fatalf("%s: kind %q with %d devices, want k8s.gpu.tessera.dev/claim with one:\n%s", path, spec.Kind, len(spec.Devices), data)
	}
	t.Logf("%s:\n%s", path, data)
	return spec.Devices[0]
}

// wantSpecEnv checks that the CDI device sets each variable to its value.
func wantSpecEnv(t *testing.T, dev cdispec.Device, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, kv := range dev.ContainerEdits.Env {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	framework.WantVars(t, "CDI device "+dev.Name, got, want)
}

// claimUID returns the UID of the pod's claim entry's ResourceClaim.
func claimUID(t *testing.T, c *framework.Cluster, p framework.SpecPod, podClaim string) (string, types.UID) {
	t.Helper()
	name, err := framework.PodClaimName(p.Pod, podClaim)
	if err != nil {
		t.Fatal(err)
	}
	claim, err := c.Client.ResourceV1().ResourceClaims(p.Pod.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return name, claim.UID
}

// waitUnprepared deletes the pod and waits until the claim's CDI spec and
// every given host path are gone (the kubelet's unprepare).
func waitUnprepared(t *testing.T, c *framework.Cluster, ns, pod string, uid types.UID, paths ...string) {
	t.Helper()
	ctx := context.Background()
	if err := c.DeletePodAndWait(ctx, ns, pod); err != nil {
		t.Fatal(err)
	}
	paths = append(paths, framework.CDISpecPath(uid))
	err := framework.Poll(ctx, "claim "+string(uid)+"'s files to be removed", framework.PodTimeout, func(context.Context) (bool, error) {
		for _, p := range paths {
			if _, err := os.Stat(p); err == nil {
				return false, framework.Retry("%s still there", p)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod %s deleted; its claim was unprepared: %s removed", pod, strings.Join(paths, ", "))
}

// driverMemoryHookScript stands in for the NVIDIA container toolkit's
// nvidia-cdi-hook. The runtime runs it on the host as a createRuntime hook,
// with the container's state on stdin; it appends one line per call to the
// file named in it: the container ID, its arguments, the hook's own
// environment and the NVIDIA_GPU_MEMORY_* variables of the container's OCI
// spec (where the real hook reads them), and succeeds.
const driverMemoryHookScript = `#!/bin/sh
PATH=/usr/sbin:/usr/bin:/sbin:/bin
state=$(cat)
id=$(printf '%%s' "$state" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
bundle=$(printf '%%s' "$state" | sed -n 's/.*"bundle":"\([^"]*\)".*/\1/p')
vars=$(grep -o '"NVIDIA_GPU_MEMORY_[A-Z]*=[^"]*"' "$bundle/config.json" | tr -d '"' | sort | tr '\n' ' ')
echo "id=$id debug=$NVIDIA_CTK_DEBUG args=$* vars=$vars" >> '%s'
exit 0
`

// hookCall is one line of driverMemoryHookScript's log.
type hookCall struct{ id, debug, args, vars string }

func readHookCalls(t *testing.T, path string) []hookCall {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var calls []hookCall
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var c hookCall
		rest, _ := strings.CutPrefix(line, "id=")
		c.id, rest, _ = strings.Cut(rest, " debug=")
		c.debug, rest, _ = strings.Cut(rest, " args=")
		c.args, c.vars, _ = strings.Cut(rest, " vars=")
		c.vars = strings.TrimSpace(c.vars)
		calls = append(calls, c)
	}
	return calls
}

// driverMemoryClaim is a DriverMemory share chosen by the claim's own
// config, 6Gi and 20 cores.
func driverMemoryClaim(name string) framework.Claim {
	return framework.Claim{Name: name, Memory: "6Gi", Cores: "20", Config: framework.GpuConfig("sharing: {isolation: DriverMemory}")}
}

// driverMemoryClass is the README's DeviceClass for DriverMemory shares:
// Tessera's shared devices on nodes that publish driverMemoryLimits=true,
// pinned to DriverMemory by its config.
func driverMemoryClass(t *testing.T, c *framework.Cluster, name string) {
	t.Helper()
	ctx := context.Background()
	classes := c.Client.ResourceV1().DeviceClasses()
	_ = classes.Delete(ctx, name, metav1.DeleteOptions{})
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tessera.dev/e2e": "true"}},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.tessera.dev" && ` +
				`device.attributes["gpu.tessera.dev"].type == "shared" && ` +
				`device.attributes["gpu.tessera.dev"].driverMemoryLimits == true`}}},
			Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: framework.Driver, Parameters: runtime.RawExtension{Raw: []byte(
					`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"DriverMemory","allowedIsolations":["DriverMemory"]}}`)}},
			}}},
		},
	}
	if _, err := classes.Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := classes.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("cleanup: delete DeviceClass %s: %v", name, err)
		}
	})
}

// TestDriverMemoryBackend: with the test knob --mock-driver-memory-limits and
// --nvidia-cdi-hook-path naming a recording stand-in for nvidia-cdi-hook
// (helm upgrade), every device publishes driverMemoryLimits=true. A
// DriverMemory share (the claim's config, 6Gi) gets a CDI device with the
// createRuntime hook `apply-cuda-memory-limits --driver-root / --gpu-id
// <uuid>` and NVIDIA_GPU_MEMORY_REQUEST/LIMIT=6144 (MiB), the singular names
// the toolkit's merged hook reads; the container
// runtime really runs the hook, once, for the pod's container, whose OCI
// spec holds those variables; the container sees them with
// CUDA_VISIBLE_DEVICES=<uuid> and its GPU's limits; the claim's attestation
// says DriverMemory enforces memory, not compute. A claim of the README's
// DeviceClass (driverMemoryLimits == true) runs too. After the release's
// values are restored, every device publishes driverMemoryLimits=false, a
// claim of that class is unschedulable, and a DriverMemory share chosen by
// the claim's config fails to prepare with the reason in the claim's status
// (Ready=False/PrepareFailed) and a PrepareFailed event.
func TestDriverMemoryBackend(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	framework.RequireNodeFiles(t)
	ctx := context.Background()

	// The stand-in hook; the runtime runs it on this host.
	hookDir := t.TempDir()
	hook, hookLog := filepath.Join(hookDir, "nvidia-cdi-hook"), filepath.Join(hookDir, "calls")
	if err := os.WriteFile(hook, []byte(fmt.Sprintf(driverMemoryHookScript, hookLog)), 0o755); err != nil {
		t.Fatal(err)
	}
	const class = "e2e-driver-memory.shared.gpu.tessera.dev"
	driverMemoryClass(t, c, class)

	restore := framework.HelmValues(t, c, map[string]any{"kubeletPlugin": map[string]any{
		"extraArgs":    append(currentExtraArgs(t), "--mock-driver-memory-limits"),
		"driverMemory": map[string]any{"hookPath": hook},
	}})
	args := pluginArgs(t, c)
	if !slices.Contains(args, "--mock-driver-memory-limits") || !slices.Contains(args, "--nvidia-cdi-hook-path="+hook) {
		t.Fatalf("plugin args %q lack --mock-driver-memory-limits and --nvidia-cdi-hook-path=%s", args, hook)
	}
	waitDriverMemoryAttribute(t, c, true)

	ns := c.Namespace(t, "e2e-drivermemory")
	objs := append(driverMemoryClaim("dmem").WithPod(), framework.Claim{Name: "dmem-class", Class: class, Memory: "3Gi", Cores: "10"}.WithPod()...)
	pods := c.RunObjects(t, ns, objs...)

	for _, tc := range []struct {
		pod    string
		memory string
		mib    string
		cores  int64
	}{
		{pod: "dmem", memory: "6Gi", mib: "6144", cores: 20},
		{pod: "dmem-class", memory: "3Gi", mib: "3072", cores: 10},
	} {
		p := pods[tc.pod]
		dev := framework.ClaimOf(t, c, p, "gpu")
		uuid := dev.Attribute("uuid")
		if got := dev.Attribute("driverMemoryLimits"); got != "true" {
			t.Errorf("pod %s: allocated device %s has driverMemoryLimits %q, want true", tc.pod, dev.Result.Device, got)
		}
		framework.WantGPUs(t, "pod "+tc.pod, p.Env, framework.EnforcedShareGPU(t, dev, tc.memory, tc.cores))
		framework.WantEnv(t, p, map[string]string{
			"NVIDIA_GPU_MEMORY_REQUEST":       tc.mib,
			"NVIDIA_GPU_MEMORY_LIMIT":         tc.mib,
			"NVIDIA_GPU_MEMORY_REQUESTS":      "",
			"NVIDIA_GPU_MEMORY_LIMITS":        "",
			"TF_FORCE_GPU_ALLOW_GROWTH":       "",
			"CUDA_MPS_PIPE_DIRECTORY":         "",
			"CUDA_DEVICE_MEMORY_LIMIT_0":      "",
			"CUDA_DEVICE_MEMORY_SHARED_CACHE": "",
		})

		// The claim's CDI spec: the hook and the variables.
		claimName, uid := claimUID(t, c, p, "gpu")
		sd := claimSpecDevice(t, uid)
		wantSpecEnv(t, sd, map[string]string{
			"NVIDIA_GPU_MEMORY_REQUEST": tc.mib,
			"NVIDIA_GPU_MEMORY_LIMIT":   tc.mib,
			"CUDA_VISIBLE_DEVICES":      uuid,
		})
		wantArgs := []string{"nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", uuid}
		hooks := sd.ContainerEdits.Hooks
		if len(hooks) != 1 || hooks[0].HookName != "createRuntime" || hooks[0].Path != hook ||
			!slices.Equal(hooks[0].Args, wantArgs) || !slices.Equal(hooks[0].Env, []string{"NVIDIA_CTK_DEBUG=false"}) {
			t.Errorf("pod %s: CDI device %s hooks %s; want one createRuntime hook %s %q with env NVIDIA_CTK_DEBUG=false",
				tc.pod, sd.Name, mustJSON(hooks), hook, wantArgs)
		}
		if len(sd.ContainerEdits.Mounts) != 0 {
			t.Errorf("pod %s: CDI device %s has mounts %s; DriverMemory adds none", tc.pod, sd.Name, mustJSON(sd.ContainerEdits.Mounts))
		}

		// The runtime ran the hook for the pod's container, once, with the
		// spec's arguments and the container's limits in its OCI spec.
		ctrID := strings.TrimPrefix(p.Pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
		var mine []hookCall
		for _, call := range readHookCalls(t, hookLog) {
			if call.id == ctrID {
				mine = append(mine, call)
			}
		}
		wantCall := hookCall{id: ctrID, debug: "false", args: strings.Join(wantArgs[1:], " "),
			vars: "NVIDIA_GPU_MEMORY_LIMIT=" + tc.mib + " NVIDIA_GPU_MEMORY_REQUEST=" + tc.mib}
		if len(mine) != 1 || mine[0] != wantCall {
			t.Errorf("pod %s: the runtime ran the hook for container %s as %+v; want once, %+v (all calls: %+v)",
				tc.pod, framework.ShortID(ctrID), mine, wantCall, readHookCalls(t, hookLog))
		} else {
			t.Logf("pod %s: the runtime ran %s %s for container %s, which had %s", tc.pod, hook, mine[0].args, framework.ShortID(ctrID), mine[0].vars)
		}

		a := attestation(t, c, ns, claimName)
		if a.Isolation != configapi.IsolationDriverMemory || a.Enforced == nil || *a.Enforced != (configapi.EnforcedLimits{Memory: true}) ||
			a.Backend == nil || len(a.Backend.Hooks) != 1 || a.Backend.Hooks[0].Path != hook || !slices.Equal(a.Backend.Hooks[0].Args, wantArgs) {
			t.Errorf("claim %s: attestation %s; want DriverMemory enforcing memory only, with the hook %s %q", claimName, mustJSON(a), hook, wantArgs)
		}
		waitUnprepared(t, c, ns, tc.pod, uid)
	}

	// Back to the release's values: the node cannot enforce DriverMemory.
	restore()
	waitDriverMemoryAttribute(t, c, false)
	objs = append(driverMemoryClaim("refused").WithPod(), framework.Claim{Name: "unschedulable", Class: class, Memory: "3Gi", Cores: "10"}.WithPod()...)
	c.Apply(t, ns, objs...)

	cond, err := c.WaitForUnschedulable(ctx, ns, "unschedulable")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod unschedulable (class %s, no device with driverMemoryLimits=true): %s", class, cond.Message)

	const reason = "isolation DriverMemory: this node cannot enforce driver memory limits (mock GPUs (the test knob --mock-driver-memory-limits is off))"
	c.WantPrepareFailed(ctx, t, ns, "refused", "refused", reason)
	var events []string
	err = framework.Poll(ctx, "a PrepareFailed event on claim refused", framework.LogTimeout, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ResourceClaim,involvedObject.name=refused,reason=PrepareFailed"})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		events = events[:0]
		for _, e := range list.Items {
			events = append(events, e.Message)
			if strings.Contains(e.Message, reason) {
				return true, nil
			}
		}
		return false, framework.Retry("events %q", events)
	})
	if err != nil {
		t.Error(err)
	}
	c.WantNoContainerRunning(ctx, t, ns, "refused")
}

// hamiLibrarySource is the dummy libvgpu.so: harmless, but its constructor
// records in the claim's shared directory which program the dynamic loader
// preloaded it into, so the test sees /etc/ld.so.preload take effect.
const hamiLibrarySource = `
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void tessera_e2e_preloaded(void) {
	char exe[256];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n < 0) n = 0;
	exe[n++] = '\n';
	int fd = open("/tmp/vgpulock/preloaded", O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd >= 0) {
		(void)write(fd, exe, (size_t)n);
		close(fd);
	}
}
`

// hamiImage builds and pushes to the local cluster's registry an image with
// the dummy libvgpu.so at the chart's default hamiCore.imageLibraryPath,
// busybox (sh, cp, mv for the chart's installer) and a dynamically linked
// program, /usr/bin/dyn-true (the host's true, with its loader and libc).
// It returns the image's repository and tag and the library's bytes.
func hamiImage(t *testing.T) (repository, tag string, lib []byte) {
	t.Helper()
	dir := t.TempDir()
	src, so := filepath.Join(dir, "libvgpu.c"), filepath.Join(dir, "libvgpu.so")
	if err := os.WriteFile(src, []byte(hamiLibrarySource), 0o644); err != nil {
		t.Fatal(err)
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("a C compiler (gcc) builds the test's dummy libvgpu.so: %v", err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("build the dummy libvgpu.so: %v\n%s", err, out)
	}
	lib, err = os.ReadFile(so)
	if err != nil {
		t.Fatal(err)
	}
	trueBin, err := filepath.EvalSymlinks("/bin/true")
	if err != nil {
		t.Fatal(err)
	}

	local := filepath.Join(framework.RepoRoot, "demo", "clusters", "local")
	registry := os.Getenv("TESSERA_REGISTRY")
	if out, err := exec.Command(filepath.Join(local, "cluster.sh"), "env").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "export TESSERA_REGISTRY="); ok {
				registry = v
			}
		}
	}
	if registry == "" {
		t.Skip("no local cluster registry (demo/clusters/local/cluster.sh env names none): cannot push the HAMi-core test image")
	}
	state := os.Getenv("TESSERA_STATE_DIR")
	if state == "" {
		state = "/tmp/tessera-local"
	}
	builder := filepath.Join(state, "build", "imagebuild")
	if _, err := os.Stat(builder); err != nil {
		builder = filepath.Join(dir, "imagebuild")
		cmd := exec.Command("go", "build", "-o", builder, "./demo/clusters/local/imagebuild")
		cmd.Dir = framework.RepoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build imagebuild: %v\n%s", err, out)
		}
	}
	applets, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatalf("/bin/busybox --list (the local cluster's busybox-static): %v", err)
	}
	args := []string{"--file", "/bin/busybox:/bin/busybox"}
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" {
			args = append(args, "--symlink", "/bin/"+a+":busybox")
		}
	}
	sum := sha256.Sum256(lib)
	repository, tag = registry+"/tessera/e2e-hami-core", "e2e-"+hex.EncodeToString(sum[:6])
	args = append(args, "--ref", repository+":"+tag, "--with-libs",
		"--file", so+":/k8s-vgpu/lib/nvidia/libvgpu.so",
		"--file", trueBin+":/usr/bin/dyn-true",
		"--arg", "sh")
	if out, err := exec.Command(builder, args...).CombinedOutput(); err != nil {
		t.Fatalf("imagebuild %s:%s: %v\n%s", repository, tag, err, out)
	}
	t.Logf("pushed %s:%s (libvgpu.so md5 %x)", repository, tag, md5.Sum(lib))
	return repository, tag, lib
}

// hamiShare is a HAMiCore share (6Gi, 30 cores guaranteed, computeLimit 40)
// for hamiClient's pod.
var hamiShare = framework.Claim{Name: "hami", Template: true, Memory: "6Gi", Cores: "30", Config: framework.GpuConfig("sharing: {isolation: HAMiCore, computeLimit: 40}")}

// hamiClient is hamiShare's client, in image: it prints its env and what it
// finds of HAMi-core: the mounts of the library, the preload file and the
// shared directory (MOUNT_<path>=<root> <options> from /proc/self/mountinfo),
// the preload file's content, the library's md5, whether the library, the
// preload file and the shared directory can be opened for writing (busybox's
// test -w says yes to root on a read-only mount; an append of nothing changes
// nothing), and whether running a dynamically linked program preloads the
// library. Busybox is static: its own programs
// never load it.
func hamiClient(image string) *unstructured.Unstructured {
	pod := framework.ScriptPod("hami-client", "hami", true, `
env | grep -E "^(NVIDIA_|CUDA_|TESSERA_|TF_FORCE)" | sort
awk '$5 ~ "^(/usr/local/vgpu|/etc/ld.so.preload|/tmp/vgpulock)" { print "MOUNT_" $5 "=" $4 " " $6 }' /proc/self/mountinfo
echo "PRELOAD_FILE=$(cat /etc/ld.so.preload)"
echo "LIB_MD5=$(md5sum /usr/local/vgpu/libvgpu.so | cut -d' ' -f1)"
if (: >> /usr/local/vgpu/libvgpu.so) 2>/dev/null; then echo LIB_ACCESS=writable; else echo LIB_ACCESS=read-only; fi
if (: >> /etc/ld.so.preload) 2>/dev/null; then echo PRELOAD_ACCESS=writable; else echo PRELOAD_ACCESS=read-only; fi
if [ -e /tmp/vgpulock/preloaded ]; then echo PRELOADED_BEFORE=yes; else echo PRELOADED_BEFORE=no; fi
/usr/bin/dyn-true; echo "DYNAMIC_EXIT=$?"
echo "PRELOADED_INTO=$(cat /tmp/vgpulock/preloaded 2>/dev/null)"
if touch /tmp/vgpulock/tenant-was-here 2>/dev/null; then echo SHARED_DIR=writable; else echo SHARED_DIR=read-only; fi
`)
	pod.Spec.Containers[0].Image = image
	return framework.Unstructured(pod)
}

// TestHAMiCoreBackend: the chart's hamiCore.image installer (helm upgrade
// with an image built here: a dummy libvgpu.so, busybox and a dynamically
// linked program) copies the library to hamiCore.installDir on the node
// before the plugin starts, and the plugin runs with
// --hami-core-library=<installDir>/libvgpu.so. A HAMiCore share (6Gi, 30
// cores, computeLimit 40) gets a CDI device with
// CUDA_DEVICE_MEMORY_LIMIT_0=6144m, CUDA_DEVICE_SM_LIMIT_0=40,
// CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpulock/cudevshr.cache,
// CUDA_VISIBLE_DEVICES=<uuid> and exactly three bind mounts: the installed
// library file (read-only) at /usr/local/vgpu/libvgpu.so, the plugin's
// ld.so.preload file (read-only) at /etc/ld.so.preload, and the claim's own
// directory /var/run/tessera/hami-claims/<claim uid> (the chart's
// hamiCore.claimRoot; read-write, mode 1777) at
// /tmp/vgpulock. In the container: those variables and the GPU's limits,
// the two files mounted alone (no directory over /usr/local/vgpu) and
// read-only, the library byte-identical to the one built, the directory
// writable and shared with the host; a dynamically linked program gets the
// library preloaded. The attestation says HAMiCore enforces memory and
// compute. Deleting the pod removes the claim's spec and directory. The
// release's values are restored at the end.
func TestHAMiCoreBackend(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	framework.RequireNodeFiles(t)
	ctx := context.Background()

	repository, tag, lib := hamiImage(t)
	installDir := t.TempDir()
	installed := filepath.Join(installDir, "libvgpu.so")
	framework.HelmValues(t, c, map[string]any{"kubeletPlugin": map[string]any{"hamiCore": map[string]any{
		"image":      map[string]any{"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
		"installDir": installDir,
	}}})

	// The installer ran, and the plugin uses what it installed.
	plugin, err := c.ReadyPluginPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	initOK := false
	for _, s := range plugin.Status.InitContainerStatuses {
		initOK = initOK || s.Name == "install-hami-core" && s.State.Terminated != nil && s.State.Terminated.ExitCode == 0
	}
	if !initOK {
		t.Errorf("plugin pod %s: init container install-hami-core did not exit 0: %+v", plugin.Name, plugin.Status.InitContainerStatuses)
	}
	if got, err := os.ReadFile(installed); err != nil || string(got) != string(lib) {
		t.Fatalf("the installer's %s: %d bytes, %v; want the image's libvgpu.so (%d bytes)", installed, len(got), err, len(lib))
	}
	if args := pluginArgs(t, c); !slices.Contains(args, "--hami-core-library="+installed) {
		t.Fatalf("plugin args %q lack --hami-core-library=%s", args, installed)
	}
	t.Logf("init container install-hami-core installed %s; the plugin runs with --hami-core-library=%s", installed, installed)

	ns := c.Namespace(t, "e2e-hamicore")
	p := c.RunObjects(t, ns, hamiShare.Object(), hamiClient(repository+":"+tag))["hami-client"]
	dev := framework.ClaimOf(t, c, p, "gpu")
	uuid := dev.Attribute("uuid")
	claimName, uid := claimUID(t, c, p, "gpu")
	dataDir := filepath.Dir(framework.CheckpointFile)
	preloadFile := filepath.Join(dataDir, "hami", "ld.so.preload")
	claimDir := filepath.Join("/var/run/tessera/hami-claims", string(uid))

	// The container: variables, limits, mounts, files.
	framework.WantGPUs(t, "pod hami-client", p.Env, framework.EnforcedShareGPU(t, dev, "6Gi", 40))
	framework.WantEnv(t, p, map[string]string{
		"CUDA_DEVICE_MEMORY_LIMIT_0":      "6144m",
		"CUDA_DEVICE_SM_LIMIT_0":          "40",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": hamiSharedRegion,
		"CUDA_DEVICE_MEMORY_LIMIT":        "",
		"CUDA_DEVICE_SM_LIMIT":            "",
		"NVIDIA_GPU_MEMORY_LIMIT":         "",
		"TF_FORCE_GPU_ALLOW_GROWTH":       "",
		"PRELOAD_FILE":                    hamiLibrary,
		"LIB_MD5":                         fmt.Sprintf("%x", md5.Sum(lib)),
		"LIB_ACCESS":                      "read-only",
		"PRELOAD_ACCESS":                  "read-only",
		"SHARED_DIR":                      "writable",
		"PRELOADED_BEFORE":                "no",
		"DYNAMIC_EXIT":                    "0",
		"PRELOADED_INTO":                  "/usr/bin/dyn-true",
		"MOUNT_/usr/local/vgpu":           "",
	})
	// MOUNT_<path>=<root of the mount in its filesystem> <options>: the
	// host's files (their path within the host's filesystem ends with the
	// host path's name) and options.
	for _, m := range []struct{ path, rootSuffix, mode string }{
		{hamiLibrary, "/libvgpu.so", "ro"},
		{hamiPreload, "/hami/ld.so.preload", "ro"},
		{hamiSharedDir, "/hami-claims/" + string(uid), "rw"},
	} {
		got, ok := p.Env["MOUNT_"+m.path]
		root, opts, _ := strings.Cut(got, " ")
		if !ok || !strings.HasSuffix(root, m.rootSuffix) || !slices.Contains(strings.Split(opts, ","), m.mode) ||
			!slices.Contains(strings.Split(opts, ","), "nosuid") || !slices.Contains(strings.Split(opts, ","), "nodev") {
			t.Errorf("pod hami-client: mount at %s is %q (present %v); want a %s,nosuid,nodev bind of ...%s", m.path, got, ok, m.mode, m.rootSuffix)
		}
	}

	// The claim's CDI spec.
	sd := claimSpecDevice(t, uid)
	wantSpecEnv(t, sd, map[string]string{
		"CUDA_DEVICE_MEMORY_LIMIT_0":      "6144m",
		"CUDA_DEVICE_SM_LIMIT_0":          "40",
		"CUDA_DEVICE_MEMORY_SHARED_CACHE": hamiSharedRegion,
		"CUDA_VISIBLE_DEVICES":            uuid,
	})
	wantMounts := []cdispec.Mount{
		{HostPath: installed, ContainerPath: hamiLibrary, Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}},
		{HostPath: preloadFile, ContainerPath: hamiPreload, Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}},
		{HostPath: claimDir, ContainerPath: hamiSharedDir, Type: "bind", Options: []string{"bind", "rw", "nosuid", "nodev"}},
	}
	var gotMounts []cdispec.Mount
	for _, m := range sd.ContainerEdits.Mounts {
		gotMounts = append(gotMounts, *m)
	}
	if mustJSON(gotMounts) != mustJSON(wantMounts) {
		t.Errorf("CDI device %s mounts\n  %s\nwant\n  %s", sd.Name, mustJSON(gotMounts), mustJSON(wantMounts))
	}
	if len(sd.ContainerEdits.Hooks) != 0 {
		t.Errorf("CDI device %s has hooks %s; HAMiCore adds none", sd.Name, mustJSON(sd.ContainerEdits.Hooks))
	}

	// The host side of the mounts.
	if got, err := os.ReadFile(preloadFile); err != nil || string(got) != hamiLibrary+"\n" {
		t.Errorf("%s: %q, %v; want %q", preloadFile, got, err, hamiLibrary+"\n")
	}
	fi, err := os.Stat(claimDir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("claim directory %s: %v, %v; want a directory with mode 1777", claimDir, fi, err)
	}
	for _, name := range []string{"tenant-was-here", "preloaded"} {
		if _, err := os.Stat(filepath.Join(claimDir, name)); err != nil {
			t.Errorf("the file the container wrote to %s/%s is not in the claim's directory on the host: %v", hamiSharedDir, name, err)
		}
	}

	a := attestation(t, c, ns, claimName)
	if a.Isolation != configapi.IsolationHAMiCore || a.Enforced == nil || *a.Enforced != (configapi.EnforcedLimits{Memory: true, Cores: true}) ||
		a.CoresLimit != 40 || a.Backend == nil || len(a.Backend.Mounts) != 3 {
		t.Errorf("claim %s: attestation %s; want HAMiCore enforcing memory and compute (limit 40%%), with its three mounts", claimName, mustJSON(a))
	}

	waitUnprepared(t, c, ns, "hami-client", uid, claimDir)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}
