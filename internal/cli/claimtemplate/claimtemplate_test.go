package claimtemplate

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/fraction"
	"github.com/tessera-dev/tessera/pkg/model"
	"github.com/tessera-dev/tessera/pkg/webhook"
)

func TestBuildErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		opts Options
		want []string
	}{
		"no name":               {Options{}, []string{`--name "":`}},
		"bad name":              {Options{Name: "Big_Name"}, []string{`--name "Big_Name":`}},
		"negative gpus":         {Options{Name: "x", GPUs: -1}, []string{"--gpus -1: must be between 1 and 32"}},
		"too many gpus":         {Options{Name: "x", GPUs: 33}, []string{"--gpus 33: must be between 1 and 32"}},
		"bad memory":            {Options{Name: "x", Memory: "lots"}, []string{`--memory "lots": not a quantity`}},
		"zero memory":           {Options{Name: "x", Memory: "0"}, []string{`--memory "0": must be positive`}},
		"cores over 100":        {Options{Name: "x", Cores: 150}, []string{"--cores 150: must be between 0 and 100"}},
		"bad nvlink":            {Options{Name: "x", GPUs: 2, NVLink: "always"}, []string{`--nvlink "always": must be prefer or require`}},
		"nvlink one gpu":        {Options{Name: "x", NVLink: NVLinkRequire}, []string{"--nvlink require: needs --gpus 2 or more"}},
		"isolation on whole":    {Options{Name: "x", Isolation: "MPS"}, []string{"--isolation and --compute-limit apply to shares"}},
		"bad fraction":          {Options{Name: "x", Fraction: "2/1", Models: testModels}, []string{`--fraction: fraction "2/1": must be at most 1`}},
		"fraction and memory":   {Options{Name: "x", Fraction: "1/4", Memory: "1Gi", Models: testModels}, []string{"drop --memory and --cores"}},
		"fraction of two gpus":  {Options{Name: "x", Fraction: "1/4", GPUs: 2, Models: testModels}, []string{"drop --gpus and --nvlink"}},
		"fraction of no models": {Options{Name: "x", Fraction: "1/4"}, []string{"--fraction 1/4: no GPU model"}},
		"several at once": {Options{Name: "x", Cores: -1, Memory: "x"}, []string{
			`--memory "x": not a quantity`, "--cores -1: must be between 0 and 100",
		}},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := Build(tc.opts)
			if err == nil {
				t.Fatalf("Build(%+v) succeeded, want errors %q", tc.opts, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestBuildRefusesWhatAdmissionRefuses: options whose template the admission
// webhook would deny (webhook.ValidateDeviceClaim, because prepare would refuse
// the claim) are refused with the webhook's message and field path.
func TestBuildRefusesWhatAdmissionRefuses(t *testing.T) {
	const prefix = "the admission webhook would refuse this template: "
	mps := "an MPS claim must be exactly one share (a client talks to one MPS daemon, which serves one GPU), so prepare would refuse the claim"
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{
			name: "compute limit below the cores",
			opts: Options{Name: "x", Memory: "10Gi", Cores: 25, ComputeLimit: 20},
			want: prefix + `spec.spec.devices.config[0].opaque.parameters.sharing.computeLimit: Invalid value: 20: is below the 25 cores request "gpu" is allocated ` +
				`(spec.spec.devices.requests[0].exactly.capacity.requests[cores]: 25); the limit must be at least the guarantee, so prepare would refuse the claim`,
		},
		{
			name: "compute limit over 100",
			opts: Options{Name: "x", Memory: "10Gi", ComputeLimit: 150},
			want: prefix + "spec.spec.devices.config[0].opaque.parameters.sharing.computeLimit: Invalid value: 150: must be between 1 and 100",
		},
		{
			name: "isolation spelled in lower case",
			opts: Options{Name: "x", Memory: "10Gi", Isolation: "mps"},
			want: prefix + `spec.spec.devices.config[0].opaque.parameters.sharing.isolation: Unsupported value: "mps": supported values: "Advisory", "MPS", "HAMiCore", "DriverMemory"`,
		},
		{
			name: "MPS on two shares",
			opts: Options{Name: "x", GPUs: 2, Memory: "10Gi", Isolation: "MPS"},
			want: prefix + `spec.spec.devices.requests[0].exactly.count: Invalid value: 2: request "gpu" has isolation MPS ` +
				`(spec.spec.devices.config[0].opaque.parameters.sharing.isolation) and may get 2 GPUs; ` + mps,
		},
		{
			name: "MPS on two shares, NVLink preferred: both alternatives",
			opts: Options{Name: "x", GPUs: 2, Memory: "10Gi", Isolation: "MPS", NVLink: NVLinkPrefer},
			want: prefix + `spec.spec.devices.requests[0].firstAvailable[0].count: Invalid value: 2: request "gpu/nvlink" has isolation MPS ` +
				`(spec.spec.devices.config[0].opaque.parameters.sharing.isolation) and may get 2 GPUs; ` + mps + "\n" +
				`spec.spec.devices.requests[0].firstAvailable[1].count: Invalid value: 2: request "gpu/any" has isolation MPS ` +
				`(spec.spec.devices.config[0].opaque.parameters.sharing.isolation) and may get 2 GPUs; ` + mps,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, _, err := Build(tc.opts)
			if err == nil {
				t.Fatalf("Build(%+v) = %+v, want error %q", tc.opts, tmpl.Spec.Spec.Devices, tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n got %s\nwant %s", err, tc.want)
			}
		})
	}
}

func TestBuildWarnings(t *testing.T) {
	_, warnings, err := Build(Options{Name: "x", Cores: 30})
	if err != nil {
		t.Fatal(err)
	}
	want := `spec.spec.devices.requests[0].exactly.capacity.requests[memory]: not set, so request "gpu" of class shared.gpu.tessera.dev ` +
		`is allocated all of a GPU's memory and no other share fits on that GPU`
	if len(warnings) != 1 || warnings[0] != want {
		t.Errorf("warnings = %q, want [%q]", warnings, want)
	}
}

// TestModelNamesAgreeWithWebhook: the webhook spells out the class,
// capacity and attribute names of pkg/model (it is built without cgo, so it
// cannot import pkg/model). Claims written with pkg/model's names must be
// checked as such.
func TestModelNamesAgreeWithWebhook(t *testing.T) {
	path := field.NewPath("spec", "devices")
	uuid := resourceapi.FullyQualifiedName(model.DriverName + "/" + string(model.AttrUUID))
	nvlink := resourceapi.FullyQualifiedName(model.DriverName + "/" + string(model.AttrNVLinkDomain))
	config := func(params string) resourceapi.DeviceClaimConfiguration {
		return resourceapi.DeviceClaimConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: model.DriverName, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", ` + params + `}`)},
		}}}
	}
	request := func(name, class string, capacity map[resourceapi.QualifiedName]resource.Quantity) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Capacity: &resourceapi.CapacityRequirements{Requests: capacity},
		}}
	}
	check := func(name string, devices resourceapi.DeviceClaim, wantErrors, wantWarnings int) {
		t.Helper()
		errs, warnings := webhook.ValidateDeviceClaim(&devices, path)
		if len(errs) != wantErrors || len(warnings) != wantWarnings {
			t.Errorf("%s: %d errors %v and %d warnings %q, want %d and %d", name, len(errs), errs, len(warnings), warnings, wantErrors, wantWarnings)
		}
	}
	quarter := map[resourceapi.QualifiedName]resource.Quantity{model.Memory: resource.MustParse("10Gi"), model.Cores: resource.MustParse("25")}
	check("shared class and capacity names", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("a", model.SharedClassName, quarter)},
		Config:   []resourceapi.DeviceClaimConfiguration{config(`"sharing": {"computeLimit": 20, "memoryLimit": "11Gi"}`)},
	}, 2, 0)
	check("two MPS shares on one GPU by uuid", resourceapi.DeviceClaim{
		Requests:    []resourceapi.DeviceRequest{request("a", model.SharedClassName, quarter), request("b", model.SharedClassName, quarter)},
		Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: &uuid}},
		Config:      []resourceapi.DeviceClaimConfiguration{config(`"sharing": {"isolation": "MPS"}`)},
	}, 0, 0)
	check("an MPS share and a whole GPU", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("a", model.SharedClassName, quarter), request("b", model.WholeClassName, nil)},
		Config:   []resourceapi.DeviceClaimConfiguration{config(`"sharing": {"isolation": "MPS"}`)},
	}, 1, 0)
	check("HAMiCore on the MIG class", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{request("a", model.MIGClassName, nil)},
		Config:   []resourceapi.DeviceClaimConfiguration{config(`"sharing": {"isolation": "HAMiCore"}`)},
	}, 1, 0)
	check("NVLink Required on two whole GPUs in one domain", resourceapi.DeviceClaim{
		Requests:    []resourceapi.DeviceRequest{request("a", model.WholeClassName, nil), request("b", model.WholeClassName, nil)},
		Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: &nvlink}},
		Config:      []resourceapi.DeviceClaimConfiguration{config(`"topology": {"nvlink": "Required"}`)},
	}, 0, 0)
}

func TestBuildShapes(t *testing.T) {
	t.Run("one whole GPU", func(t *testing.T) {
		tmpl := mustBuild(t, Options{Name: "one"})
		d := tmpl.Spec.Spec.Devices
		if len(d.Requests) != 1 || d.Requests[0].Exactly == nil || d.Requests[0].Exactly.DeviceClassName != model.WholeClassName || d.Requests[0].Exactly.Count != 1 {
			t.Fatalf("want one exact request for 1 whole GPU, got %+v", d.Requests)
		}
		if len(d.Constraints) != 0 || len(d.Config) != 0 {
			t.Errorf("want no constraints or config, got %+v %+v", d.Constraints, d.Config)
		}
	})
	t.Run("share with MPS", func(t *testing.T) {
		tmpl := mustBuild(t, Options{Name: "s", Memory: "10Gi", Cores: 25, Isolation: "MPS", ComputeLimit: 50})
		ex := tmpl.Spec.Spec.Devices.Requests[0].Exactly
		if ex.DeviceClassName != model.SharedClassName {
			t.Errorf("class %q, want %q", ex.DeviceClassName, model.SharedClassName)
		}
		if got := ex.Capacity.Requests["memory"]; got.String() != "10Gi" {
			t.Errorf("memory %s, want 10Gi", got.String())
		}
		if got := ex.Capacity.Requests["cores"]; got.Value() != 25 {
			t.Errorf("cores %s, want 25", got.String())
		}
		cfg := decodeConfig(t, tmpl.Spec.Spec.Devices.Config[0].Opaque.Parameters.Raw)
		if cfg.Sharing == nil || cfg.Sharing.Isolation != configapi.IsolationMPS || *cfg.Sharing.ComputeLimit != 50 {
			t.Errorf("config %+v, want MPS with computeLimit 50", cfg.Sharing)
		}
	})
	t.Run("prefer NVLink pair", func(t *testing.T) {
		tmpl := mustBuild(t, Options{Name: "p", GPUs: 2, NVLink: NVLinkPrefer})
		d := tmpl.Spec.Spec.Devices
		fa := d.Requests[0].FirstAvailable
		if len(fa) != 2 || fa[0].Name != "nvlink" || fa[1].Name != "any" || fa[0].Count != 2 {
			t.Fatalf("want firstAvailable [nvlink any] of 2, got %+v", fa)
		}
		if len(d.Constraints) != 1 || d.Constraints[0].Requests[0] != "gpu/nvlink" || *d.Constraints[0].MatchAttribute != "gpu.tessera.dev/nvlinkDomain" {
			t.Errorf("want the NVLink constraint on gpu/nvlink only, got %+v", d.Constraints)
		}
	})
	t.Run("require NVLink pair: Required with the constraint admission asks for", func(t *testing.T) {
		tmpl := mustBuild(t, Options{Name: "r", GPUs: 2, NVLink: NVLinkRequire})
		d := tmpl.Spec.Spec.Devices
		if len(d.Constraints) != 1 || d.Constraints[0].Requests[0] != "gpu" || *d.Constraints[0].MatchAttribute != "gpu.tessera.dev/nvlinkDomain" {
			t.Errorf("want the NVLink constraint on gpu, got %+v", d.Constraints)
		}
		if cfg := decodeConfig(t, d.Config[0].Opaque.Parameters.Raw); cfg.Topology == nil || cfg.Topology.NVLink != configapi.NVLinkRequired {
			t.Errorf("config %+v, want topology.nvlink Required", cfg.Topology)
		}
	})
	t.Run("two shares on distinct GPUs", func(t *testing.T) {
		tmpl := mustBuild(t, Options{Name: "d", GPUs: 2, Memory: "10Gi", Cores: 50})
		c := tmpl.Spec.Spec.Devices.Constraints
		if len(c) != 1 || c[0].DistinctAttribute == nil || *c[0].DistinctAttribute != "gpu.tessera.dev/uuid" {
			t.Errorf("want a distinctAttribute uuid constraint, got %+v", c)
		}
	})
}

func mustBuild(t *testing.T, opts Options) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	tmpl, warnings, err := Build(opts)
	if err != nil {
		t.Fatalf("Build(%+v): %v", opts, err)
	}
	if len(warnings) > 0 {
		t.Errorf("Build(%+v) warns %q", opts, warnings)
	}
	return tmpl
}

func decodeConfig(t *testing.T, raw []byte) *configapi.GpuConfig {
	t.Helper()
	cfg, err := configapi.DecodeStrict(raw)
	if err != nil {
		t.Fatalf("generated GpuConfig does not decode strictly: %v\n%s", err, raw)
	}
	return cfg
}

var testModels = []fraction.Model{
	{Products: []string{"NVIDIA L4"}, Memory: resource.MustParse("23034Mi"), MemoryStep: resource.MustParse("1Mi"), Cores: 100, CoresStep: 1},
	{Products: []string{"NVIDIA H100 80GB HBM3"}, Memory: resource.MustParse("81559Mi"), MemoryStep: resource.MustParse("1Mi"), Cores: 100, CoresStep: 1},
}

// TestBuildFraction: --fraction 1/4 is one firstAvailable subrequest per
// model with its quarter, and an isolation config targets the request.
func TestBuildFraction(t *testing.T) {
	tmpl, _, err := Build(Options{Name: "q", Fraction: "1/4", Models: testModels, Isolation: "MPS"})
	if err != nil {
		t.Fatal(err)
	}
	d := tmpl.Spec.Spec.Devices
	if len(d.Requests) != 1 || d.Requests[0].Name != RequestName || len(d.Requests[0].FirstAvailable) != 2 {
		t.Fatalf("requests %+v", d.Requests)
	}
	for i, want := range []string{"5758Mi", "20389Mi"} {
		sub := d.Requests[0].FirstAvailable[i]
		if got := sub.Capacity.Requests[model.Memory]; got.String() != want || sub.DeviceClassName != model.SharedClassName {
			t.Errorf("subrequest %s: memory %s of %s, want %s of %s", sub.Name, got.String(), sub.DeviceClassName, want, model.SharedClassName)
		}
	}
	if len(d.Config) != 1 || d.Config[0].Requests[0] != RequestName {
		t.Errorf("config %+v: want one for request %s", d.Config, RequestName)
	}
}

// TestBuildMIG: --mig PROFILE is one exact request of the MIG class with a
// selector on the profile; --mig alone takes any profile; --mig --fraction
// is one subrequest per known MIG model; --isolation MPS is allowed and
// HAMiCore refused with the webhook's message; share and NVLink flags are
// refused.
func TestBuildMIG(t *testing.T) {
	tmpl := mustBuild(t, Options{Name: "m", MIG: true, MIGProfile: "3g.40gb", GPUs: 2})
	d := tmpl.Spec.Spec.Devices
	ex := d.Requests[0].Exactly
	if ex == nil || ex.DeviceClassName != model.MIGClassName || ex.Count != 2 || ex.Capacity != nil ||
		len(ex.Selectors) != 1 || ex.Selectors[0].CEL.Expression != `device.attributes["gpu.tessera.dev"].profile == "3g.40gb"` {
		t.Fatalf("request %+v: want 2 MIG devices of profile 3g.40gb", d.Requests[0])
	}
	if len(d.Constraints) != 0 {
		t.Errorf("constraints %+v, want none (two MIG devices may share a GPU)", d.Constraints)
	}
	mps := mustBuild(t, Options{Name: "m", MIG: true, MIGProfile: "3g.40gb", Isolation: "MPS"}).Spec.Spec.Devices
	if cfg := decodeConfig(t, mps.Config[0].Opaque.Parameters.Raw); cfg.Sharing.Isolation != configapi.IsolationMPS {
		t.Errorf("config %+v, want MPS", cfg.Sharing)
	}
	// An MPS daemon serves one MIG device: prepare refuses two.
	if _, _, err := Build(Options{Name: "m", MIG: true, MIGProfile: "3g.40gb", GPUs: 2, Isolation: "MPS"}); err == nil ||
		!strings.Contains(err.Error(), "an MPS claim must be exactly one share") {
		t.Errorf("two MIG devices with MPS: %v, want the webhook's refusal", err)
	}

	anyProfile := mustBuild(t, Options{Name: "m", MIG: true}).Spec.Spec.Devices.Requests[0].Exactly
	if anyProfile.DeviceClassName != model.MIGClassName || len(anyProfile.Selectors) != 0 {
		t.Errorf("--mig alone: %+v, want the MIG class without selectors", anyProfile)
	}

	frac := mustBuild(t, Options{Name: "m", MIG: true, Fraction: "1/7"}).Spec.Spec.Devices.Requests[0]
	if len(frac.FirstAvailable) != len(fraction.MIGModels()) {
		t.Fatalf("--mig --fraction 1/7: %+v, want one subrequest per MIG model", frac)
	}
	var names []string
	for _, s := range frac.FirstAvailable {
		names = append(names, s.Name)
	}
	if got, want := strings.Join(names, " "), "a100-40gb-1g-10gb a100-80gb-1g-20gb h100-80gb-1g-20gb h200-141gb-1g-35gb"; got != want {
		t.Errorf("subrequests %s, want %s", got, want)
	}

	_, warnings, err := Build(Options{Name: "m", MIG: true, MIGProfile: "1g.12gb"})
	if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], "MIG profile 1g.12gb is in none of the MIG tables Tessera knows") {
		t.Errorf("unknown profile: %v, %q; want a warning", err, warnings)
	}

	for name, tc := range map[string]struct {
		opts Options
		want string
	}{
		"HAMiCore": {Options{Name: "m", MIG: true, Isolation: "HAMiCore"},
			`the admission webhook would refuse this template: spec.spec.devices.config[0].opaque.parameters.sharing.isolation: Invalid value: "HAMiCore": request "gpu" is of DeviceClass mig.gpu.tessera.dev and gets a MIG device`},
		"memory":               {Options{Name: "m", MIG: true, Memory: "10Gi"}, "--memory and --cores size a share"},
		"nvlink":               {Options{Name: "m", MIG: true, GPUs: 2, NVLink: NVLinkRequire}, "MIG devices have no NVLink"},
		"compute limit":        {Options{Name: "m", MIG: true, ComputeLimit: 50}, "--compute-limit caps a share"},
		"profile and fraction": {Options{Name: "m", MIG: true, MIGProfile: "3g.40gb", Fraction: "1/2"}, "--mig 3g.40gb and --fraction both choose the profile"},
		"not a profile":        {Options{Name: "m", MIG: true, MIGProfile: `3g" || true`}, `--mig: MIG profile "3g\" || true": want a name`},
		"fraction of two":      {Options{Name: "m", MIG: true, Fraction: "1/2", GPUs: 2}, "drop --gpus"},
	} {
		if _, _, err := Build(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}
