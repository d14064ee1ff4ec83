package mpsdaemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

// TestPodPerDomain: two trust domains on one GPU get two daemon pods, with
// disjoint host directories and their domain in an annotation; Running
// tells them apart. The GPU-wide daemon of earlier releases keeps its old
// pod name (so a new plugin adopts it while its claims remain).
func TestPodPerDomain(t *testing.T) {
	cfg := testConfig(true)
	m := isolation.NewMPS("/var/lib/kubelet/plugins/gpu.tessera.dev/mps", nil)
	a, b := m.Daemon("GPU-1", "team-a"), m.Daemon("GPU-1", "team-b")
	pa, pb := cfg.Pod(a), cfg.Pod(b)
	if pa.Name == pb.Name {
		t.Fatalf("two domains' daemon pods share the name %s", pa.Name)
	}
	if pa.Annotations[AnnotationDomain] != "team-a" || pb.Annotations[AnnotationDomain] != "team-b" {
		t.Errorf("domain annotations %q, %q", pa.Annotations[AnnotationDomain], pb.Annotations[AnnotationDomain])
	}
	hostPaths := func(p *corev1.Pod) []string {
		var out []string
		for _, v := range p.Spec.Volumes {
			if v.HostPath != nil {
				out = append(out, v.HostPath.Path)
			}
		}
		return out
	}
	for _, x := range hostPaths(pa) {
		if slices.Contains(hostPaths(pb), x) {
			t.Errorf("both domains' pods mount %s", x)
		}
	}
	if want := "tessera-mps-gpu-1-" + shortHash("node-a/GPU-1", 8); cfg.PodName(isolation.DaemonKey{GPU: "GPU-1"}) != want {
		t.Errorf("GPU-wide daemon pod name %s, want the earlier release's %s", cfg.PodName(isolation.DaemonKey{GPU: "GPU-1"}), want)
	}

	k := &kubelet{}
	legacy := cfg.Pod(m.Daemon("GPU-2", ""))
	setReady(legacy)
	setReady(pa)
	setReady(pb)
	client := newClient(t, k, pa, pb, legacy)
	p, _ := NewPods(client, cfg)
	running, err := p.Running(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []isolation.DaemonKey{{GPU: "GPU-1", Domain: "team-a"}, {GPU: "GPU-1", Domain: "team-b"}, {GPU: "GPU-2"}}
	if diff := cmp.Diff(want, running); diff != "" {
		t.Errorf("running (-want +got):\n%s", diff)
	}
}

// TestRealPodDriverRootReadOnly: on a real node the daemon pod mounts the
// driver root read-only and nothing under it (the runtime would have to
// create mount points in it), and its arguments are exactly DaemonArgs,
// which the chart's admission policy pins.
func TestRealPodDriverRootReadOnly(t *testing.T) {
	cfg := testConfig(false)
	pod := cfg.Pod(daemonOf("GPU-1"))
	ctr := pod.Spec.Containers[0]
	var sawRoot bool
	for _, m := range ctr.VolumeMounts {
		if m.Name == "driver-root" {
			sawRoot = true
			if !m.ReadOnly || m.MountPath != ContainerDriverRoot {
				t.Errorf("driver root mounted at %s, readOnly %v; want %s read-only", m.MountPath, m.ReadOnly, ContainerDriverRoot)
			}
			continue
		}
		if !m.ReadOnly && strings.HasPrefix(m.MountPath+"/", ContainerDriverRoot+"/") {
			t.Errorf("volume %s is mounted at %s, under the driver root", m.Name, m.MountPath)
		}
	}
	if !sawRoot {
		t.Error("no driver-root mount")
	}
	// A per-domain daemon's shm is the plugin's tmpfs: the daemon checks it.
	want := []string{"mps-daemon", "run", "--gpu=GPU-1", "--ready-file=/run/tessera-mps/ready", "--driver-root=/driver-root", "--shm-tmpfs"}
	if diff := cmp.Diff(want, ctr.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, DaemonArgs("GPU-1", false, true)); diff != "" {
		t.Errorf("DaemonArgs (-want +got):\n%s", diff)
	}
	// The GPU-wide daemon of earlier releases keeps a plain directory.
	legacy := cfg.Pod(isolation.NewMPS("/var/lib/kubelet/plugins/gpu.tessera.dev/mps", nil).Daemon("GPU-1", ""))
	if diff := cmp.Diff(want[:5], legacy.Spec.Containers[0].Args); diff != "" {
		t.Errorf("GPU-wide daemon's args (-want +got):\n%s", diff)
	}
}

// TestPlanLaunch: a driver root that is a whole root filesystem is chrooted
// into, with the pod's directories bound over its /tmp and /dev/shm; one
// without a dynamic loader (COS's /home/kubernetes/bin/nvidia) runs the
// binary unchrooted with the root's libraries on LD_LIBRARY_PATH.
func TestPlanLaunch(t *testing.T) {
	mk := func(t *testing.T, root string, dirs []string, files []string, links map[string]string) {
		t.Helper()
		for _, d := range dirs {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, f := range files {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, f), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for link, target := range links {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(root, link)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("whole root", func(t *testing.T) {
		root := t.TempDir()
		// Debian's loader: lib64/ld-linux-x86-64.so.2 is an absolute link,
		// which only resolves inside the root.
		mk(t, root, []string{"tmp", "dev/shm"},
			[]string{"usr/bin/nvidia-cuda-mps-control", "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
			map[string]string{"lib64/ld-linux-x86-64.so.2": "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"})
		l, err := planLaunch(root, "GPU-1")
		if err != nil {
			t.Fatal(err)
		}
		if l.Chroot != root || l.Path != "/usr/bin/nvidia-cuda-mps-control" {
			t.Errorf("chroot %q path %q, want chroot %q", l.Chroot, l.Path, root)
		}
		wantBinds := [][2]string{{"/mps", filepath.Join(root, "tmp")}, {"/dev/shm", filepath.Join(root, "dev/shm")}}
		if diff := cmp.Diff(wantBinds, l.Binds); diff != "" {
			t.Errorf("binds (-want +got):\n%s", diff)
		}
		for _, e := range []string{"CUDA_VISIBLE_DEVICES=GPU-1", "CUDA_MPS_PIPE_DIRECTORY=/tmp/pipe", "CUDA_MPS_LOG_DIRECTORY=/tmp/log"} {
			if !slices.Contains(l.Env, e) {
				t.Errorf("env %v lacks %s", l.Env, e)
			}
		}
	})

	t.Run("no loader (COS)", func(t *testing.T) {
		root := t.TempDir()
		// A link to the container's own loader does not count: inside
		// the root it points nowhere.
		mk(t, root, nil, []string{"bin/nvidia-cuda-mps-control", "lib64/libcuda.so.1"},
			map[string]string{"lib/ld-linux-aarch64.so.1": "/nonexistent/ld.so"})
		l, err := planLaunch(root, "GPU-1")
		if err != nil {
			t.Fatal(err)
		}
		if l.Chroot != "" || l.Path != filepath.Join(root, "bin/nvidia-cuda-mps-control") || len(l.Binds) != 0 {
			t.Errorf("chroot %q path %q binds %v, want the binary run unchrooted", l.Chroot, l.Path, l.Binds)
		}
		for _, e := range []string{"LD_LIBRARY_PATH=" + filepath.Join(root, "lib64") + ":" + filepath.Join(root, "lib"), "CUDA_MPS_PIPE_DIRECTORY=/mps/pipe", "CUDA_MPS_LOG_DIRECTORY=/mps/log"} {
			if !slices.Contains(l.Env, e) {
				t.Errorf("env %v lacks %s", l.Env, e)
			}
		}
		if !strings.Contains(l.Why, "no dynamic loader") {
			t.Errorf("why %q does not say the root has no loader", l.Why)
		}
	})

	t.Run("nothing usable", func(t *testing.T) {
		root := t.TempDir()
		mk(t, root, nil, []string{"bin/nvidia-cuda-mps-control"}, nil)
		if _, err := planLaunch(root, "GPU-1"); err == nil || !strings.Contains(err.Error(), "no library directory") {
			t.Errorf("error %v, want one saying there is no library directory", err)
		}
	})
}
