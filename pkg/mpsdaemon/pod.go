package mpsdaemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

// Labels and annotations of a daemon pod.
const (
	// LabelComponent and ComponentValue mark every daemon pod.
	LabelComponent = "app.kubernetes.io/component"
	ComponentValue = "mps-control-daemon"
	// LabelManagedBy says who creates the pods (not Helm: the chart does
	// not know them).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "tessera-kubelet-plugin"
	// LabelNode holds a hash of the node's name (a node name may be longer
	// than a label value), so that a plugin lists only its own node's pods.
	LabelNode = "gpu.tessera.dev/mps-node"
	// AnnotationGPU is the UUID of the GPU the daemon serves.
	AnnotationGPU = "gpu.tessera.dev/gpu-uuid"
	// AnnotationDomain is the trust domain (namespace) whose clients the
	// daemon serves; absent on the GPU-wide daemon of earlier releases.
	AnnotationDomain = "gpu.tessera.dev/mps-domain"
	// AnnotationSpecHash is the hash of the pod as the plugin built it;
	// adoption compares it.
	AnnotationSpecHash = "gpu.tessera.dev/mps-spec-hash"
)

// Paths inside the daemon pod: the pod's own mounts, never under the driver
// root, which is mounted read-only (a chrooted daemon sees them where
// planLaunch binds them). They are not MPS's defaults (/tmp/nvidia-mps,
// /var/log/nvidia-mps): NVIDIA's tooling (libnvidia-container, the toolkit's
// generated CDI spec) mounts a host /tmp/nvidia-mps into every GPU container
// when it exists.
const (
	// ScratchDir holds the pipe and log directories.
	ScratchDir = "/mps"
	// PipeDir is the daemon's pipe directory (CUDA_MPS_PIPE_DIRECTORY).
	PipeDir = ScratchDir + "/pipe"
	// LogDir is the daemon's log directory (CUDA_MPS_LOG_DIRECTORY).
	LogDir = ScratchDir + "/log"
	// ShmDir is the daemon's /dev/shm, shared with its clients.
	ShmDir = "/dev/shm"
	// ContainerDriverRoot is where the driver root is mounted in the pod.
	ContainerDriverRoot = "/driver-root"
	// ControlSocket is the control daemon's socket in the pipe directory.
	ControlSocket = "control"
	// stateDir is a per-pod emptyDir for the ready file.
	stateDir  = "/run/tessera-mps"
	readyFile = stateDir + "/ready"
	// DefaultBinary is the plugin's binary in its image.
	DefaultBinary = "/usr/bin/tessera-kubelet-plugin"
	// containerName is the daemon's container.
	containerName = "mps-control-daemon"
)

// Config describes the daemon pods of one node.
type Config struct {
	// Namespace is the plugin's namespace; the pods are created there.
	Namespace string
	// NodeName is the plugin's node (spec.nodeName of every pod).
	NodeName string
	// Image runs the daemon: the plugin's image, or one with the plugin's
	// binary at Binary.
	Image            string
	ImagePullPolicy  corev1.PullPolicy
	ImagePullSecrets []string
	// Binary is the plugin's binary in Image; empty: DefaultBinary.
	Binary string
	// PriorityClassName of the pods; empty: none.
	PriorityClassName string
	// Mock runs the fake daemon (mock GPU profiles): no driver root, no
	// privileges.
	Mock bool
	// DriverRoot is the host path of the NVIDIA driver root (real nodes).
	DriverRoot string
	// ReadyTimeout bounds how long Start waits for a pod to be Ready;
	// zero: DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// PollInterval is how often Start looks at the pod; zero: 250ms.
	PollInterval time.Duration
	// Resources of the daemon container. No requests and no limits:
	// DefaultResources. The MPS server in the pod serves every client
	// process of its GPU (it relays their work submission), so a real node
	// should size it and make it Guaranteed (limits equal to requests):
	// a daemon that is throttled slows all of them, and one that is
	// OOM-killed ends all of their CUDA contexts.
	Resources corev1.ResourceRequirements
}

// DefaultResources are requests small enough for a 2-core test node and no
// limits (Burstable QoS).
func DefaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("100m"),
		corev1.ResourceMemory: resource.MustParse("128Mi"),
	}}
}

func (c Config) resources() corev1.ResourceRequirements {
	if len(c.Resources.Requests) == 0 && len(c.Resources.Limits) == 0 {
		return DefaultResources()
	}
	return c.Resources
}

// daemonResources are the resources a daemon pod may request or be limited in.
var daemonResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage}

// ParseResourceList parses name=quantity pairs (cpu, memory,
// ephemeral-storage), naming the pair that is wrong.
func ParseResourceList(pairs map[string]string) (corev1.ResourceList, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	list := corev1.ResourceList{}
	for name, value := range pairs {
		if !slices.Contains(daemonResources, corev1.ResourceName(name)) {
			return nil, fmt.Errorf("%s=%s: unknown resource %q (want one of %v)", name, value, name, daemonResources)
		}
		q, err := resource.ParseQuantity(value)
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", name, value, err)
		}
		if q.Sign() < 0 {
			return nil, fmt.Errorf("%s=%s: negative quantity", name, value)
		}
		list[corev1.ResourceName(name)] = q
	}
	return list, nil
}

// validateResources refuses what the API server would refuse at the first
// MPS prepare: a limit below its request.
func validateResources(r corev1.ResourceRequirements) error {
	for name, limit := range r.Limits {
		if req, ok := r.Requests[name]; ok && limit.Cmp(req) < 0 {
			return fmt.Errorf("%s limit %s is below its request %s", name, limit.String(), req.String())
		}
	}
	return nil
}

// DefaultReadyTimeout leaves a prepare time to report before the kubelet's
// own deadline for the call.
const DefaultReadyTimeout = 30 * time.Second

func (c Config) binary() string {
	if c.Binary == "" {
		return DefaultBinary
	}
	return c.Binary
}

// nodeHash is the value of LabelNode for the config's node.
func (c Config) nodeHash() string { return shortHash(c.NodeName, 16) }

func shortHash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

var notDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// PodName is the name of the daemon pod of a (GPU, trust domain) on the
// config's node: readable (the GPU's UUID) and unique per node and domain (a
// hash of the node name, the GPU and the domain). The GPU-wide daemon of
// earlier releases (domain "") keeps the name it had, so that its pod is
// adopted.
func (c Config) PodName(key isolation.DaemonKey) string {
	id := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(key.GPU), "-"), "-")
	if len(id) > 40 {
		id = id[:40]
	}
	seed := c.NodeName + "/" + key.GPU
	if key.Domain != "" {
		seed += "/" + key.Domain
	}
	return "tessera-mps-" + id + "-" + shortHash(seed, 8)
}

// Pod is the daemon pod of d as this plugin creates it, with its spec hash
// in AnnotationSpecHash.
func (c Config) Pod(d isolation.Daemon) *corev1.Pod {
	args := DaemonArgs(d.UUID, c.Mock, !c.Mock && d.Domain != "")
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
		Command: []string{c.binary(), "mps-daemon", "ready", "--ready-file=" + readyFile},
	}}}
	startup := probe.DeepCopy()
	startup.PeriodSeconds, startup.FailureThreshold, startup.TimeoutSeconds = 1, 120, 5
	readiness := probe.DeepCopy()
	readiness.PeriodSeconds, readiness.FailureThreshold, readiness.TimeoutSeconds = 10, 3, 5

	dirOrCreate := ptr.To(corev1.HostPathDirectoryOrCreate)
	volumes := []corev1.Volume{
		{Name: "pipe", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: d.PipeDir, Type: dirOrCreate}}},
		{Name: "shm", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: d.ShmDir, Type: dirOrCreate}}},
		{Name: "log", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: d.LogDir, Type: dirOrCreate}}},
		{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("1Mi"))}}},
	}
	mounts := []corev1.VolumeMount{
		{Name: "pipe", MountPath: PipeDir},
		{Name: "shm", MountPath: ShmDir},
		{Name: "log", MountPath: LogDir},
		{Name: "state", MountPath: stateDir},
	}
	security := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	if !c.Mock {
		// Read-only: the daemon writes only its own directories, which are
		// mounts of their own outside it (planLaunch binds them into a
		// chrooted daemon's view in the pod's mount namespace).
		// RecursiveReadOnly would also make the host's submounts under a
		// driver root of / read-only (its /dev among them), which the GPU's
		// device nodes and the host's /dev/shm must not be for the daemon
		// pod; the daemon never writes there but the runtime may refuse.
		volumes = append([]corev1.Volume{{Name: "driver-root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: c.DriverRoot, Type: ptr.To(corev1.HostPathDirectory)}}}}, volumes...)
		mounts = append([]corev1.VolumeMount{{Name: "driver-root", MountPath: ContainerDriverRoot, ReadOnly: true}}, mounts...)
		// The daemon opens the GPU's device nodes, binds its directories
		// into the driver root's view and chroots into it.
		security = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	var pullSecrets []corev1.LocalObjectReference
	for _, s := range c.ImagePullSecrets {
		pullSecrets = append(pullSecrets, corev1.LocalObjectReference{Name: s})
	}
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      c.PodName(d.Key()),
			Namespace: c.Namespace,
			Labels: map[string]string{
				LabelComponent: ComponentValue,
				LabelManagedBy: ManagedByValue,
				LabelNode:      c.nodeHash(),
			},
			Annotations: map[string]string{AnnotationGPU: d.UUID},
		},
		Spec: corev1.PodSpec{
			NodeName:      c.NodeName,
			RestartPolicy: corev1.RestartPolicyAlways,
			// MPS matches clients to the server by PID; clients run in
			// other pods' PID namespaces (real nodes only).
			HostPID:                       !c.Mock,
			PriorityClassName:             c.PriorityClassName,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: ptr.To[int64](15),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			ImagePullSecrets:              pullSecrets,
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           c.Image,
				ImagePullPolicy: c.ImagePullPolicy,
				Command:         []string{c.binary()},
				Args:            args,
				StartupProbe:    startup,
				ReadinessProbe:  readiness,
				Resources:       c.resources(),
				SecurityContext: security,
				VolumeMounts:    mounts,
			}},
			Volumes: volumes,
		},
	}
	if d.Domain != "" {
		pod.Annotations[AnnotationDomain] = d.Domain
	}
	pod.Annotations[AnnotationSpecHash] = specHash(pod)
	return pod
}

// DaemonArgs is the whole argument list of a daemon pod's container, which
// the chart's admission policy pins: nothing but the GPU varies, and the
// driver root is always the pod's read-only mount of the configured one.
// shmTmpfs (a per-domain daemon on a real node, whose shm directory the
// plugin mounts as a tmpfs of its own) adds --shm-tmpfs: after a reboot the
// pod may restart before the plugin mounts it again, and must then not serve
// its clients from the root disk's plain directory.
func DaemonArgs(gpu string, mock, shmTmpfs bool) []string {
	args := []string{"mps-daemon", "run", "--gpu=" + gpu, "--ready-file=" + readyFile}
	if mock {
		return append(args, "--fake")
	}
	args = append(args, "--driver-root="+ContainerDriverRoot)
	if shmTmpfs {
		args = append(args, ShmTmpfsFlag)
	}
	return args
}

// ShmTmpfsFlag is the daemon's flag that makes it refuse a shm directory
// that is not a tmpfs.
const ShmTmpfsFlag = "--shm-tmpfs"

// specHash hashes what the plugin decides about a pod: its labels, the GPU
// and its spec as built (before the API server's defaults).
func specHash(pod *corev1.Pod) string {
	// A PodSpec and strings always encode.
	raw, _ := json.Marshal(struct {
		Labels map[string]string
		GPU    string
		Domain string `json:",omitempty"`
		Spec   corev1.PodSpec
	}{pod.Labels, pod.Annotations[AnnotationGPU], pod.Annotations[AnnotationDomain], pod.Spec})
	return shortHash(string(raw), 16)
}
