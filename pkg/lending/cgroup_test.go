package lending

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

const testPod = types.UID("0b5a9c1e-77aa-4d0e-9a55-3f1c2d4e5f60")

// cgroupTree makes a fake cgroup v2 hierarchy: every directory gets
// cgroup.kill (an empty file that Kill overwrites), the root
// cgroup.controllers.
func cgroupTree(t *testing.T, root string, dirs ...string) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, d, "cgroup.kill"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func killed(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.kill"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b) == "1"
}

func TestKillPodByKubeletLayout(t *testing.T) {
	underscored := strings.ReplaceAll(string(testPod), "-", "_")
	for _, tc := range []struct {
		name string
		// root is below the mount (hybrid hosts: unified).
		sub, pod, other string
	}{
		{"systemd burstable", "", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + underscored + ".slice",
			"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1111_2222.slice"},
		{"systemd guaranteed", "", "kubepods.slice/kubepods-pod" + underscored + ".slice", "kubepods.slice/kubepods-pod1111.slice"},
		{"cgroupfs besteffort", "", "kubepods/besteffort/pod" + string(testPod), "kubepods/besteffort/pod1111"},
		{"cgroupfs on a hybrid host", "unified", "kubepods/pod" + string(testPod), "kubepods/pod1111"},
		{"custom kubelet cgroup root", "", "k8s.slice/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + underscored + ".slice", "system.slice/containerd.service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mount := t.TempDir()
			root := filepath.Join(mount, tc.sub)
			cgroupTree(t, root, tc.pod, tc.pod+"/cri-containerd-abc.scope", tc.other)
			got, err := Cgroups{Root: mount}.KillPod(testPod, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{filepath.Join(root, tc.pod)}; !slices.Equal(got, want) {
				t.Fatalf("killed %q, want %q", got, want)
			}
			if !killed(t, filepath.Join(root, tc.pod)) {
				t.Error("the pod's cgroup.kill was not written")
			}
			if killed(t, filepath.Join(root, tc.other)) {
				t.Error("another pod's cgroup was killed")
			}
		})
	}
}

// fakeProc writes <proc>/<pid>/cgroup.
func fakeProc(t *testing.T, proc, pid, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A kubelet without pod cgroups (cgroupsPerQOS: false, as on the local
// cluster): the containers of the pod's GPU processes are killed.
func TestKillPodByProcess(t *testing.T) {
	mount, proc := t.TempDir(), t.TempDir()
	cgroupTree(t, filepath.Join(mount, "unified"), "k8s.io/c1", "k8s.io/c2", "k8s.io/c3")
	fakeProc(t, proc, "100", "12:memory:/k8s.io/c1\n0::/k8s.io/c1\n")
	fakeProc(t, proc, "101", "0::/k8s.io/c1\n") // the same container
	fakeProc(t, proc, "102", "0::/k8s.io/c2\n")
	got, err := Cgroups{Root: mount, ProcRoot: proc}.KillPod(testPod, []uint32{100, 101, 102})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(mount, "unified")
	if want := []string{filepath.Join(root, "k8s.io/c1"), filepath.Join(root, "k8s.io/c2")}; !slices.Equal(got, want) {
		t.Fatalf("killed %q, want %q", got, want)
	}
	if killed(t, filepath.Join(root, "k8s.io/c3")) {
		t.Error("a container without the pod's processes was killed")
	}
}

// A PID must never take down a group of many pods or the host: the root,
// a QoS or runtime parent, a path outside the plugin's cgroup namespace.
func TestKillPodRefusesNonContainerCgroups(t *testing.T) {
	mount, proc := t.TempDir(), t.TempDir()
	cgroupTree(t, mount, "kubepods.slice", "k8s.io", "system.slice")
	for pid, cg := range map[string]string{"1": "0::/\n", "2": "0::/kubepods.slice\n", "3": "0::/k8s.io\n", "4": "0::/../../kubepods.slice/x\n", "5": "12:memory:/x\n"} {
		fakeProc(t, proc, pid, cg)
	}
	got, err := Cgroups{Root: mount, ProcRoot: proc}.KillPod(testPod, []uint32{1, 2, 3, 4, 5, 6})
	if err == nil || len(got) != 0 {
		t.Fatalf("killed %q (%v), want nothing and an error", got, err)
	}
	for _, want := range []string{"no cgroup of pod " + string(testPod), "cgroup / is not a container's", "outside this plugin's cgroup namespace", "no cgroup v2 entry", "process 6"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	for _, d := range []string{"kubepods.slice", "k8s.io", "system.slice"} {
		if killed(t, filepath.Join(mount, d)) {
			t.Errorf("%s was killed", d)
		}
	}
}

func TestKillPodNeedsCgroupV2(t *testing.T) {
	mount := t.TempDir() // no cgroup.controllers: a cgroup v1 host
	if _, err := (Cgroups{Root: mount}).KillPod(testPod, nil); err == nil || !strings.Contains(err.Error(), "cgroup v2") {
		t.Fatalf("error %v, want one naming cgroup v2", err)
	}
	// A kernel without cgroup.kill.
	cgroupTree(t, mount)
	dir := filepath.Join(mount, "kubepods", "pod"+string(testPod))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := (Cgroups{Root: mount}).KillPod(testPod, nil); err == nil || !strings.Contains(err.Error(), "5.14") {
		t.Fatalf("error %v, want one naming the kernel that has cgroup.kill", err)
	}
}
