package metrics

import (
	"cmp"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
)

// PodRef names a pod.
type PodRef struct {
	UID       types.UID
	Namespace string
	Name      string
}

// Pods resolves pod UIDs (from cgroup paths) to names. The plugin answers
// from the reservedFor lists of the claims it prepared, so no pod access is
// needed: a process in a pod that holds no Tessera claim keeps an empty name.
type Pods interface {
	Pod(uid types.UID) (PodRef, bool)
}

// PodUsage is the GPU memory a pod's processes use on one GPU.
type PodUsage struct {
	Namespace, Pod string
	PodUID         types.UID
	UUID           string
	Minor          int
	UsedBytes      int64
}

// Usage maps NVML's per-process GPU memory to pods:
//
//	nvmlDeviceGetComputeRunningProcesses (pid, used memory)
//	  → <ProcRoot>/<pid>/cgroup → pod UID (the kubelet's cgroup naming,
//	    cgroupfs "…/pod<uid>/…" or systemd "…-pod<uid_with_underscores>.slice/…")
//	  → Pods → namespace/name.
//
// NVML reports PIDs of the host's PID namespace when the caller can see
// them, so on a real node the plugin runs with hostPID (or ProcRoot is the
// host's /proc mounted into the container). Processes whose cgroup names
// no pod (system daemons, a pod-less container) are summed under an empty
// pod; a process that exited between the two reads is skipped.
type Usage struct {
	Lib nvml.Interface
	// ProcRoot is where /proc of the PID namespace NVML's PIDs belong to is
	// mounted; empty means /proc.
	ProcRoot string
	Pods     Pods
}

// notAvailable is NVML_VALUE_NOT_AVAILABLE for unsigned long long: what the
// driver reports as used memory when it cannot account per process.
const notAvailable = ^uint64(0)

// Collect returns the per-pod usage on each of the GPUs, sorted by GPU minor,
// then namespace, pod and pod UID. GPUs NVML cannot answer for are skipped.
func (u *Usage) Collect(gpus []GPU) []PodUsage {
	root := u.ProcRoot
	if root == "" {
		root = "/proc"
	}
	var out []PodUsage
	for _, g := range gpus {
		dev, ret := u.Lib.DeviceGetHandleByUUID(g.UUID)
		if ret != nvml.SUCCESS {
			continue
		}
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			continue
		}
		byPod := map[types.UID]*PodUsage{}
		for _, p := range procs {
			if p.UsedGpuMemory == notAvailable {
				continue
			}
			data, err := os.ReadFile(filepath.Join(root, strconv.FormatUint(uint64(p.Pid), 10), "cgroup"))
			if err != nil {
				continue // exited, or not visible
			}
			uid, _ := PodUIDFromCgroup(string(data))
			pu, ok := byPod[uid]
			if !ok {
				pu = &PodUsage{PodUID: uid, UUID: g.UUID, Minor: g.Minor}
				if uid != "" && u.Pods != nil {
					if ref, ok := u.Pods.Pod(uid); ok {
						pu.Namespace, pu.Pod = ref.Namespace, ref.Name
					}
				}
				byPod[uid] = pu
			}
			pu.UsedBytes += int64(min(p.UsedGpuMemory, 1<<62))
		}
		for _, pu := range byPod {
			out = append(out, *pu)
		}
	}
	slices.SortFunc(out, func(a, b PodUsage) int {
		return cmp.Or(cmp.Compare(a.Minor, b.Minor), cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.PodUID, b.PodUID))
	})
	return out
}

// podUIDPattern matches the pod segment of a kubelet cgroup path: "pod" and a
// UUID, with dashes (cgroupfs driver) or underscores (systemd driver, where
// "-" separates slice levels).
var podUIDPattern = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// PodUIDFromCgroup returns the pod UID in the content of a /proc/<pid>/cgroup
// file (cgroup v1 or v2, cgroupfs or systemd naming), or ok=false when the
// process is in no pod's cgroup.
func PodUIDFromCgroup(content string) (types.UID, bool) {
	for _, line := range strings.Split(content, "\n") {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "kubepods") {
			continue
		}
		if m := podUIDPattern.FindAllStringSubmatch(parts[2], -1); len(m) > 0 {
			return types.UID(strings.ReplaceAll(m[len(m)-1][1], "_", "-")), true
		}
	}
	return "", false
}
