//go:build e2e

package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// Device classes of the chart.
const (
	WholeClass  = "gpu.tessera.dev"
	SharedClass = "shared.gpu.tessera.dev"
)

// Claim describes a ResourceClaim, or with Template a ResourceClaimTemplate,
// with one request for Tessera devices. The zero value but for Name asks for
// one whole GPU.
type Claim struct {
	Name string
	// Template makes Object a ResourceClaimTemplate.
	Template bool
	// Request is the request's name; "gpu" when empty.
	Request string
	// Class is the DeviceClass; when empty SharedClass if Memory or Cores
	// is set, else WholeClass.
	Class string
	// Count, when above 0, asks for that many devices (allocationMode
	// ExactCount).
	Count int64
	// Memory and Cores are the capacity requested of a share ("8Gi", "10").
	Memory, Cores string
	// Selectors are CEL expressions every device must satisfy.
	Selectors []string
	// Config is the opaque configuration for gpu.tessera.dev (YAML or
	// JSON, as written; GpuConfig builds one), applied to the request.
	Config string
	// Labels and Annotations go on the claim's (or template's) metadata.
	Labels, Annotations map[string]string
	// ClaimAnnotations go on the metadata of the claims a template makes
	// (its spec.metadata).
	ClaimAnnotations map[string]string
}

// GpuConfig is a GpuConfig object with the given fields, as YAML flow:
// GpuConfig("sharing: {isolation: MPS}").
func GpuConfig(fields string) string {
	return "{apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, " + fields + "}"
}

// PinnedToMinor is a CEL selector for the GPU with this minor (its whole,
// shared or lent device).
func PinnedToMinor(minor any) string {
	return fmt.Sprintf(`device.attributes["gpu.tessera.dev"].minor == %v`, minor)
}

// PinnedToUUID is a CEL selector for the GPU with this UUID.
func PinnedToUUID(uuid string) string {
	return fmt.Sprintf(`device.attributes["gpu.tessera.dev"].uuid == %q`, uuid)
}

func (c Claim) request() string {
	if c.Request == "" {
		return "gpu"
	}
	return c.Request
}

func (c Claim) class() string {
	switch {
	case c.Class != "":
		return c.Class
	case c.Memory != "" || c.Cores != "":
		return SharedClass
	}
	return WholeClass
}

// Spec is the claim's spec. It panics on a Config that is not YAML, or a
// quantity that does not parse: both are written in the test.
func (c Claim) Spec() resourceapi.ResourceClaimSpec {
	exactly := &resourceapi.ExactDeviceRequest{DeviceClassName: c.class()}
	if c.Count > 0 {
		exactly.AllocationMode = resourceapi.DeviceAllocationModeExactCount
		exactly.Count = c.Count
	}
	for _, expr := range c.Selectors {
		exactly.Selectors = append(exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	}
	if c.Memory != "" || c.Cores != "" {
		exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		if c.Memory != "" {
			exactly.Capacity.Requests["memory"] = resource.MustParse(c.Memory)
		}
		if c.Cores != "" {
			exactly.Capacity.Requests["cores"] = resource.MustParse(c.Cores)
		}
	}
	devices := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: c.request(), Exactly: exactly}}}
	if c.Config != "" {
		// JSON goes as written (a test may send what a parser would
		// normalize); YAML is converted.
		raw := []byte(c.Config)
		if !json.Valid(raw) {
			var err error
			if raw, err = yaml.YAMLToJSON(raw); err != nil {
				panic(fmt.Sprintf("claim %s: config %q: %v", c.Name, c.Config, err))
			}
		}
		devices.Config = []resourceapi.DeviceClaimConfiguration{{
			Requests: []string{c.request()},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     Driver,
				Parameters: runtime.RawExtension{Raw: raw},
			}},
		}}
	}
	return resourceapi.ResourceClaimSpec{Devices: devices}
}

func (c Claim) meta() metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: c.Name, Labels: maps.Clone(c.Labels), Annotations: maps.Clone(c.Annotations)}
}

// ResourceClaim is the claim, typed.
func (c Claim) ResourceClaim() *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: c.meta(),
		Spec:       c.Spec(),
	}
}

// ResourceClaimTemplate is a template of the claim, typed.
func (c Claim) ResourceClaimTemplate() *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"},
		ObjectMeta: c.meta(),
		Spec: resourceapi.ResourceClaimTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: maps.Clone(c.ClaimAnnotations)},
			Spec:       c.Spec(),
		},
	}
}

// Object is the claim (or, with Template, the template) for Apply and
// RunObjects.
func (c Claim) Object() *unstructured.Unstructured {
	if c.Template {
		return Unstructured(c.ResourceClaimTemplate())
	}
	return Unstructured(c.ResourceClaim())
}

// Unstructured is a typed object, its TypeMeta set, for Apply and
// RunObjects: without the empty creationTimestamp and status the conversion
// writes.
func Unstructured(obj runtime.Object) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		panic(fmt.Sprintf("%T: %v", obj, err))
	}
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "status")
	return u
}

// WithPod is the claim (or template) and an EnvPod using it as its claim
// entry "gpu", both named Name: the pair most tests run.
func (c Claim) WithPod() []*unstructured.Unstructured {
	return []*unstructured.Unstructured{c.Object(), EnvPod(c.Name, c.Name, c.Template)}
}

// CreateClaim creates the claim (or, with Template, the template) in ns
// through the typed client, without a cleanup: the namespace's deletion
// removes it. Its error is the API server's answer, for tests of admission.
func (c *Cluster) CreateClaim(ctx context.Context, ns string, cl Claim) error {
	var err error
	if cl.Template {
		_, err = c.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, cl.ResourceClaimTemplate(), metav1.CreateOptions{})
	} else {
		_, err = c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, cl.ResourceClaim(), metav1.CreateOptions{})
	}
	return err
}
