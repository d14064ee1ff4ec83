package scale

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-dev/tessera/pkg/model"
)

// Workload is one kind of pod the benchmark schedules: every pod of a run is the
// same Pod (under a different name), and Template, when set, is the
// ResourceClaimTemplate its claim comes from.
type Workload struct {
	// Name identifies the workload in flags and reports (plain, whole-claim, …).
	Name string
	// Description says in a few words what each pod asks for.
	Description string
	// GPUs is how many whole GPUs one pod takes (0 for plain pods; a share counts
	// as 1/SharesPerGPU).
	GPUs float64
	// Template is the claim template the pods name, nil for none.
	Template *resourceapi.ResourceClaimTemplate
	// pod returns the pod named name in namespace ns.
	pod func(ns, name string) *corev1.Pod
}

// Pod returns the workload's pod named name in namespace ns, labelled with the run.
func (w Workload) Pod(ns, name, run string) *corev1.Pod {
	p := w.pod(ns, name)
	p.Labels = map[string]string{RunLabel: run, WorkloadLabel: w.Name}
	return p
}

// Labels of the benchmark's pods.
const (
	// RunLabel is the same on every pod of one run of one workload.
	RunLabel = "scale.tessera.dev/run"
	// WorkloadLabel is the workload's name.
	WorkloadLabel = "scale.tessera.dev/workload"
)

// Share sizes: a quarter of an H100 80GB (it publishes 81089Mi, so four 20Gi
// shares would not fit), as in demo/specs/10-quarter-gpu-shares.yaml.
const (
	ShareMemory  = "19Gi"
	ShareCores   = "25"
	SharesPerGPU = 4
)

// ShareSelector is the CEL selector of the share-cel workload: a device of a
// named product with at least 40Gi of memory, the shape of a user who pins the
// GPU model. Every hgx-h100 shared device passes it.
const ShareSelector = `device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA H100") && ` +
	`device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0`

// Workloads returns the benchmark's workloads in report order, their claim
// templates in namespace ns:
//
//   - plain: a pod without claims (the scheduler's baseline);
//   - whole-claim: one whole GPU from a claim template (class gpu.tessera.dev);
//   - whole-extended: one whole GPU as resources.limits["tessera.dev/gpu"]: 1, which
//     the scheduler turns into a claim of the same class;
//   - share: a quarter GPU, capacity.requests {memory: 19Gi, cores: 25}, from class
//     shared.gpu.tessera.dev;
//   - share-cel: the same share with ShareSelector added;
//   - nvlink-pair: two whole GPUs in one NVLink domain, falling back to any two, as
//     demo/specs/30-nvlink-pair.yaml.
func Workloads(ns string) []Workload {
	share := func(selectors []resourceapi.DeviceSelector) resourceapi.DeviceClaim {
		return resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: model.SharedClassName,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           1,
				Selectors:       selectors,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					model.Memory: resource.MustParse(ShareMemory),
					model.Cores:  resource.MustParse(ShareCores),
				}},
			},
		}}}
	}
	pair := resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{
			Name: "gpus",
			FirstAvailable: []resourceapi.DeviceSubRequest{
				{Name: "nvlink", DeviceClassName: model.WholeClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2},
				{Name: "any", DeviceClassName: model.WholeClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2},
			},
		}},
		Constraints: []resourceapi.DeviceConstraint{{
			Requests:       []string{"gpus/nvlink"},
			MatchAttribute: ptrQualified(model.DriverName + "/" + string(model.AttrNVLinkDomain)),
		}},
		Config: []resourceapi.DeviceClaimConfiguration{{
			Requests: []string{"gpus"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     model.DriverName,
				Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","topology":{"nvlink":"Preferred"}}`)},
			}},
		}},
	}
	whole := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name:    "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: model.WholeClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}}
	cel := []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: ShareSelector}}}

	return []Workload{
		{Name: "plain", Description: "no claim", pod: basePod},
		claimWorkload(ns, "whole-claim", "1 whole GPU, claim template", 1, whole),
		{
			Name: "whole-extended", Description: "1 whole GPU, " + model.ExtendedResourceName, GPUs: 1,
			pod: func(ns, name string) *corev1.Pod {
				p := basePod(ns, name)
				one := corev1.ResourceList{model.ExtendedResourceName: resource.MustParse("1")}
				p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: one, Requests: one}
				return p
			},
		},
		claimWorkload(ns, "share", fmt.Sprintf("share %s + %s cores, claim template", ShareMemory, ShareCores), 1.0/SharesPerGPU, share(nil)),
		claimWorkload(ns, "share-cel", "the share + a CEL selector", 1.0/SharesPerGPU, share(cel)),
		claimWorkload(ns, "nvlink-pair", "2 NVLink-matched whole GPUs (firstAvailable)", 2, pair),
	}
}

func ptrQualified(s string) *resourceapi.FullyQualifiedName {
	n := resourceapi.FullyQualifiedName(s)
	return &n
}

// claimWorkload is a workload whose pods each get one claim from a template
// named after the workload.
func claimWorkload(ns, name, desc string, gpus float64, claim resourceapi.DeviceClaim) Workload {
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: claim}},
	}
	return Workload{
		Name: name, Description: desc, GPUs: gpus, Template: tmpl,
		pod: func(ns, podName string) *corev1.Pod {
			p := basePod(ns, podName)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl.Name}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
			return p
		},
	}
}

// basePod is a pod with one container and no requests; kwok never runs it.
func basePod(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			AutomountServiceAccountToken:  new(bool),
			Containers:                    []corev1.Container{{Name: "ctr", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
}

// WorkloadNames are the names of Workloads, in order.
func WorkloadNames() []string {
	var names []string
	for _, w := range Workloads("") {
		names = append(names, w.Name)
	}
	return names
}
