//go:build e2e

package e2e

import (
	"context"
	"testing"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// floorSharedSelector selects Tessera's shared devices, as the chart's
// shared.gpu.tessera.dev does (deployments/helm/tessera/templates/deviceclasses.yaml).
const floorSharedSelector = `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "shared"`

// floorClass creates a DeviceClass of Tessera's shares whose config is the
// given GpuConfig (JSON), and deletes it when the test ends. A class left
// behind by an interrupted run is replaced. Create it before the test's
// namespace, so that the namespace (with its claims) goes first.
func floorClass(t *testing.T, c *framework.Cluster, name, gpuConfig string) {
	t.Helper()
	ctx := context.Background()
	classes := c.Client.ResourceV1().DeviceClasses()
	if err := classes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete a leftover DeviceClass %s: %v", name, err)
	}
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tessera.dev/e2e": "true"}},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: floorSharedSelector}}},
			Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: framework.Driver, Parameters: runtime.RawExtension{Raw: []byte(gpuConfig)}},
			}}},
		},
	}
	if _, err := classes.Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := classes.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup: delete DeviceClass %s: %v", name, err)
		}
	})
}

// floorClaim is one share (4Gi, 10 cores) of class, with gpuConfig (JSON)
// as its opaque config for gpu.tessera.dev; no config when empty.
func floorClaim(name, class, gpuConfig string, template bool) framework.Claim {
	return framework.Claim{Name: name, Template: template, Class: class, Memory: "4Gi", Cores: "10", Config: gpuConfig}
}

// TestFloorRefusesWeakerIsolationAtAdmission: an admin pins enforced shares
// with a DeviceClass whose config sets isolation MPS and allowedIsolations
// [MPS]; a claim (or claim template) of that class whose own config asks for
// Advisory is refused when it is created, with the config's field path and
// the class's list; so is a claim config that sets allowedIsolations itself.
// A claim that asks for MPS is admitted.
func TestFloorRefusesWeakerIsolationAtAdmission(t *testing.T) {
	c := needCluster(t)
	framework.RequireWebhook(t, c)
	const class = "e2e-pinned.gpu.tessera.dev"
	floorClass(t, c, class, `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","allowedIsolations":["MPS"]}}`)
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-floor")

	const reason = `Invalid value: "Advisory": request "gpu" is of DeviceClass ` + class + `, whose config allows only MPS (sharing.allowedIsolations); ` +
		`a claim may choose only an isolation its class allows, so prepare would refuse the claim`
	tests := []admissionCase{
		{
			name:      "advisory",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"Advisory"}}`,
			want: `admission webhook "resourceclaims.gpu.tessera.dev" denied the request: ` +
				`spec.devices.config[0].opaque.parameters.sharing.isolation: ` + reason,
		},
		{
			name:      "advisory-template",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"Advisory","computeLimit":50}}`,
			template:  true,
			want: `admission webhook "resourceclaimtemplates.gpu.tessera.dev" denied the request: ` +
				`spec.spec.devices.config[0].opaque.parameters.sharing.isolation: ` + reason,
		},
		{
			name:      "claim-widens-the-floor",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"Advisory","allowedIsolations":["Advisory"]}}`,
			want: `admission webhook "resourceclaims.gpu.tessera.dev" denied the request: ` +
				`spec.devices.config[0].opaque.parameters.sharing.allowedIsolations: Forbidden: only a DeviceClass config may set it`,
		},
		{
			name:      "mps",
			gpuConfig: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"isolation":"MPS","computeLimit":50}}`,
		},
	}
	checkAdmission(t, tests, func(tc admissionCase) error {
		return c.CreateClaim(ctx, ns, floorClaim(tc.name, class, tc.gpuConfig, tc.template))
	})
}

// TestFloorRefusesAtPrepare: the kubelet plugin enforces the floor too, on
// what admission does not see. A claim with no config of its own is not sent
// to the webhook; its class allows only MPS and sets no isolation, so the
// node's --default-isolation (Advisory) applies, outside the class's
// allowedIsolations: prepare refuses the share and writes why into the
// claim's status (Ready=False), naming the isolation, who chose it and the
// class's list. The pod does not start.
func TestFloorRefusesAtPrepare(t *testing.T) {
	c := needDriver(t, "shared.gpu.tessera.dev")
	const class = "e2e-broken-floor.gpu.tessera.dev"
	floorClass(t, c, class, `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"allowedIsolations":["MPS"]}}`)
	ctx := context.Background()
	ns := c.Namespace(t, "e2e-floor-prepare")

	if err := c.CreateClaim(ctx, ns, floorClaim("weak", class, "", false)); err != nil {
		t.Fatalf("create the claim: %v", err)
	}
	c.Apply(t, ns, framework.EnvPod("weak", "weak", false))

	const want = `isolation Advisory (the node's --default-isolation, as neither the claim's nor the class's config sets one) is not allowed by the device class's config (allowed: MPS)`
	c.WantPrepareFailed(ctx, t, ns, "weak", "weak", want)
	c.WantNoContainerRunning(ctx, t, ns, "weak")
}
