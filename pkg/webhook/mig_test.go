package webhook

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/pkg/model/modelnames"
)

// migClasses are the classes of the MIG admission tests: pkg/model's
// mig.gpu.tessera.dev selector, a class of an admin's that selects MIG
// devices of one profile, and one that selects shares.
func migClasses() DeviceClassLookup {
	class := func(name, expression string) *resourceapi.DeviceClass {
		c := testClass(name)
		c.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expression}}}
		return c
	}
	return DeviceClassMap(map[string]*resourceapi.DeviceClass{
		modelnames.MIGClassName: class(modelnames.MIGClassName, `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "mig"`),
		"mig-3g":                class("mig-3g", `device.attributes['gpu.tessera.dev']['type'] == 'mig' && device.attributes["gpu.tessera.dev"].profile == "3g.40gb"`),
		"mig-reversed":          class("mig-reversed", `"mig" == device.attributes["gpu.tessera.dev"].type`),
		"team-shares":           class("team-shares", `device.attributes["gpu.tessera.dev"].type == "shared"`),
	})
}

// TestValidateDeviceClaimMIG: a request for MIG devices may not ask for
// HAMiCore or DriverMemory isolation (MIG is the isolation) nor lend; MPS
// and Advisory are allowed; a config that names only other requests does not
// reach the MIG request. Errors carry the config field's path.
func TestValidateDeviceClaimMIG(t *testing.T) {
	const cfg = `{apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, `
	mig := func(class string) string {
		return `
requests:
- name: mig
  exactly:
    deviceClassName: ` + class + `
    selectors: [{cel: {expression: 'device.attributes["gpu.tessera.dev"].profile == "3g.40gb"'}}]`
	}
	config := func(requests, fields string) string {
		return `
config:
- requests: [` + requests + `]
  opaque: {driver: gpu.tessera.dev, parameters: ` + cfg + fields + `}}`
	}
	isolation0 := "spec.devices.config[0].opaque.parameters.sharing.isolation"
	secondDevice := func(second, request, isolation string) string {
		return `spec.devices.requests[0]: request "` + second + `" adds a second gpu.tessera.dev device to a claim whose request "` + request + `" has isolation ` + isolation +
			` (` + isolation0 + `); an ` + isolation + ` claim must be exactly one share, so prepare would refuse the claim ` +
			`(two shares are one GPU only when a matchAttribute gpu.tessera.dev/uuid constraint covers both requests)`
	}
	hami := func(request, class string) string {
		return isolation0 + `: Invalid value: "HAMiCore": request "` + request + `" is of DeviceClass ` + class + ` and gets a MIG device, which MIG isolates in hardware: ` +
			`HAMiCore isolation does not apply to MIG devices (HAMi-core limits a process's share of a whole GPU by intercepting CUDA; ` +
			`a MIG device's memory and SMs are already its own; MPS inside a MIG device is allowed), so prepare would refuse the claim; ` +
			`drop it, or name only other requests in spec.devices.config[0].requests`
	}
	tests := []struct {
		name       string
		devices    string
		classes    bool
		wantErrors []string
	}{
		{
			name:       "HAMiCore on the MIG class",
			devices:    mig(modelnames.MIGClassName) + config("mig", `sharing: {isolation: HAMiCore}`),
			wantErrors: []string{hami("mig", modelnames.MIGClassName)},
		},
		{
			name:    "DriverMemory on the MIG class",
			devices: mig(modelnames.MIGClassName) + config("", `sharing: {isolation: DriverMemory}`),
			wantErrors: []string{isolation0 + `: Invalid value: "DriverMemory": request "mig" is of DeviceClass mig.gpu.tessera.dev and gets a MIG device, ` +
				`which MIG isolates in hardware: DriverMemory isolation does not apply to MIG devices (the driver's memory limit caps a share of a whole GPU; ` +
				`a MIG device's memory is already its own; MPS inside a MIG device is allowed), so prepare would refuse the claim; ` +
				`drop it, or name only other requests in spec.devices.config[0].requests`},
		},
		{
			name:    "MPS inside a MIG device",
			devices: mig(modelnames.MIGClassName) + config("mig", `sharing: {isolation: MPS}`),
		},
		{
			name:    "Advisory on a MIG device",
			devices: mig(modelnames.MIGClassName) + config("mig", `sharing: {isolation: Advisory}`),
		},
		{
			name:    "lending a MIG device",
			devices: mig(modelnames.MIGClassName) + config("mig", `lending: {lendWhenIdle: true}`),
			wantErrors: []string{`spec.devices.config[0].opaque.parameters.lending.lendWhenIdle: Invalid value: true: request "mig" is of DeviceClass mig.gpu.tessera.dev ` +
				`and gets a MIG device; MIG devices are not lendable (a GPU in MIG mode publishes no lent device); drop it, or name only other requests in spec.devices.config[0].requests`},
		},
		{
			name:    "lendWhenIdle false on a MIG device",
			devices: mig(modelnames.MIGClassName) + config("mig", `lending: {lendWhenIdle: false}`),
		},
		{
			name: "HAMiCore for a share beside a MIG request, the config naming the share: two devices, which HAMiCore cannot be",
			devices: mig(modelnames.MIGClassName) + `
- name: share
  exactly: {deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 8Gi, cores: "10"}}}` + config("share", `sharing: {isolation: HAMiCore}`),
			wantErrors: []string{secondDevice("mig", "share", "HAMiCore")},
		},
		{
			name: "a config for every request reaches the MIG request too",
			devices: mig(modelnames.MIGClassName) + `
- name: share
  exactly: {deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 8Gi, cores: "10"}}}` + config("", `sharing: {isolation: HAMiCore}`),
			wantErrors: []string{secondDevice("mig", "share", "HAMiCore"), hami("mig", modelnames.MIGClassName)},
		},
		{
			name: "MPS inside a MIG device beside a whole GPU: two devices, which MPS cannot be",
			devices: mig(modelnames.MIGClassName) + `
- name: whole
  exactly: {deviceClassName: gpu.tessera.dev}` + config("mig", `sharing: {isolation: MPS}`),
			wantErrors: []string{`spec.devices.requests[1]: request "whole" adds a second gpu.tessera.dev device to a claim whose request "mig" has isolation MPS ` +
				`(spec.devices.config[0].opaque.parameters.sharing.isolation); an MPS claim must be exactly one share, so prepare would refuse the claim ` +
				`(two shares are one GPU only when a matchAttribute gpu.tessera.dev/uuid constraint covers both requests)`},
		},
		{
			name: "a MIG alternative of a firstAvailable request",
			devices: `
requests:
- name: gpu
  firstAvailable:
  - {name: share, deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 8Gi, cores: "10"}}}
  - {name: mig, deviceClassName: mig.gpu.tessera.dev}` + config("gpu", `sharing: {isolation: HAMiCore}`),
			wantErrors: []string{hami("gpu/mig", modelnames.MIGClassName)},
		},
		{
			name: "admin access to a MIG device gets no backend",
			devices: `
requests:
- name: mig
  exactly: {deviceClassName: mig.gpu.tessera.dev, adminAccess: true}` + config("mig", `sharing: {isolation: HAMiCore}`),
		},
		{
			name:       "an admin's class that selects MIG devices, read with the classes",
			devices:    mig("mig-3g") + config("mig", `sharing: {isolation: HAMiCore}`),
			classes:    true,
			wantErrors: []string{hami("mig", "mig-3g")},
		},
		{
			name:       "... the comparison written the other way round",
			devices:    mig("mig-reversed") + config("mig", `sharing: {isolation: HAMiCore}`),
			classes:    true,
			wantErrors: []string{hami("mig", "mig-reversed")},
		},
		{
			name:    "... not known without the classes (the CLI): prepare refuses it",
			devices: mig("mig-3g") + config("mig", `sharing: {isolation: HAMiCore}`),
		},
		{
			name:    "an admin's class of shares is not MIG",
			devices: mig("team-shares") + config("mig", `sharing: {isolation: HAMiCore}`),
			classes: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			devices := decodeDevices(t, tc.devices)
			var errs field.ErrorList
			if tc.classes {
				errs, _ = ValidateDeviceClaimWithClasses(devices, field.NewPath("spec", "devices"), migClasses())
			} else {
				errs, _ = ValidateDeviceClaim(devices, field.NewPath("spec", "devices"))
			}
			checkErrors(t, errs, tc.wantErrors)
		})
	}
}

// TestReviewRefusesHAMiCoreOnMIG: kubectl apply of a ResourceClaimTemplate
// whose MIG request asks for HAMiCore is denied, and the denial names the
// field.
func TestReviewRefusesHAMiCoreOnMIG(t *testing.T) {
	raw, err := yaml.YAMLToJSON([]byte(`
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: isolated}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly: {deviceClassName: mig.gpu.tessera.dev}
      config:
      - opaque: {driver: gpu.tessera.dev, parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, sharing: {isolation: HAMiCore}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	req := &admissionv1.AdmissionRequest{
		UID: "u", Kind: metav1.GroupVersionKind{Group: ResourceGroup, Version: "v1", Kind: "ResourceClaimTemplate"},
		Operation: admissionv1.Create, Namespace: "ns", Name: "isolated",
	}
	req.Object.Raw = raw
	resp := Review(context.Background(), req, migClasses())
	if resp.Allowed {
		t.Fatal("allowed, want denied")
	}
	const want = `spec.spec.devices.config[0].opaque.parameters.sharing.isolation: Invalid value: "HAMiCore": request "mig" is of DeviceClass mig.gpu.tessera.dev and gets a MIG device`
	if !strings.Contains(resp.Result.Message, want) {
		t.Errorf("message %q, want %q in it", resp.Result.Message, want)
	}
	if len(resp.Result.Details.Causes) != 1 || resp.Result.Details.Causes[0].Field != "spec.spec.devices.config[0].opaque.parameters.sharing.isolation" {
		t.Errorf("causes %+v, want one at the config's sharing.isolation", resp.Result.Details.Causes)
	}
}

// TestReviewDeviceClassMIG: a DeviceClass that selects MIG devices may not
// set HAMiCore or DriverMemory isolation or lend; MPS is allowed, and a class
// of shares may set HAMiCore.
func TestReviewDeviceClassMIG(t *testing.T) {
	class := func(name, selector, params string) string {
		return `{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"` + name + `"},"spec":{` +
			`"selectors":[{"cel":{"expression":` + selector + `}}],` +
			`"config":[{"opaque":{"driver":"gpu.tessera.dev","parameters":{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig",` + params + `}}}]}}`
	}
	const migSelector = `"device.driver == \"gpu.tessera.dev\" && device.attributes[\"gpu.tessera.dev\"].type == \"mig\""`
	for _, tc := range []struct {
		name, object, want string
	}{
		{"HAMiCore on the MIG class", class(modelnames.MIGClassName, migSelector, `"sharing":{"isolation":"HAMiCore"}`),
			`spec.config[0].opaque.parameters.sharing.isolation: Invalid value: "HAMiCore": DeviceClass mig.gpu.tessera.dev selects MIG devices`},
		{"DriverMemory on an admin's MIG class", class("isolated", migSelector, `"sharing":{"isolation":"DriverMemory"}`),
			`spec.config[0].opaque.parameters.sharing.isolation: Invalid value: "DriverMemory": DeviceClass isolated selects MIG devices`},
		{"lending on the MIG class", class(modelnames.MIGClassName, migSelector, `"lending":{"lendWhenIdle":true}`),
			`spec.config[0].opaque.parameters.lending.lendWhenIdle: Invalid value: true: DeviceClass mig.gpu.tessera.dev selects MIG devices, which are not lendable`},
		{"MPS on the MIG class", class(modelnames.MIGClassName, migSelector, `"sharing":{"isolation":"MPS"}`), ""},
		{"HAMiCore on a class of shares", class("team", `"device.attributes[\"gpu.tessera.dev\"].type == \"shared\""`, `"sharing":{"isolation":"HAMiCore"}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := Review(context.Background(), classReview(admissionv1.Create, "v1", tc.object), nil)
			switch {
			case tc.want == "" && !resp.Allowed:
				t.Errorf("denied: %s", resp.Result.Message)
			case tc.want != "" && resp.Allowed:
				t.Errorf("allowed, want a denial with %q", tc.want)
			case tc.want != "" && !strings.Contains(resp.Result.Message, tc.want):
				t.Errorf("message %q, want %q in it", resp.Result.Message, tc.want)
			}
		})
	}
}

// TestSelectsMIG: the selector forms selectsMIG recognises, and some it must
// not mistake for MIG.
func TestSelectsMIG(t *testing.T) {
	for expr, want := range map[string]bool{
		`device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "mig"`: true,
		`device.attributes[ 'gpu.tessera.dev' ][ 'type' ]=='mig'`:                                  true,
		`'mig' == device.attributes["gpu.tessera.dev"].type`:                                       true,
		`device.attributes["gpu.tessera.dev"].type == "shared"`:                                    false,
		`device.attributes["gpu.tessera.dev"].profile == "mig"`:                                    false,
		`device.attributes["other.example.com"].type == "mig"`:                                     false,
		`device.attributes["gpu.tessera.dev"].type == "migrated"`:                                  false,
	} {
		c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}}
		c.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
		if got := selectsMIG(c); got != want {
			t.Errorf("selectsMIG(%s) = %v, want %v", expr, got, want)
		}
	}
}

// TestValidateDeviceClaimMIGAdminAccess: admin access to MIG devices is
// allowed with a warning: the scheduler may pick a dynamic MIG placement,
// which prepare refuses to admin access.
func TestValidateDeviceClaimMIGAdminAccess(t *testing.T) {
	devices := decodeDevices(t, `
requests:
- name: observe
  exactly: {deviceClassName: mig.gpu.tessera.dev, adminAccess: true}`)
	errs, warnings := ValidateDeviceClaimWithClasses(devices, field.NewPath("spec", "devices"), migClasses())
	checkErrors(t, errs, nil)
	checkWarnings(t, warnings, []string{`spec.devices.requests[0].exactly.adminAccess: admin access to MIG devices: if the scheduler picks a dynamic MIG placement (no instance yet), ` +
		`prepare refuses request "observe"; admin access observes existing instances`})
}
