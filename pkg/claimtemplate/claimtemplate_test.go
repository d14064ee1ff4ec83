package claimtemplate

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/model"
)

func TestBuildErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		opts Options
		want []string
	}{
		"no name":            {Options{}, []string{`--name "":`}},
		"bad name":           {Options{Name: "Big_Name"}, []string{`--name "Big_Name":`}},
		"negative gpus":      {Options{Name: "x", GPUs: -1}, []string{"--gpus -1: must be between 1 and 32"}},
		"too many gpus":      {Options{Name: "x", GPUs: 33}, []string{"--gpus 33: must be between 1 and 32"}},
		"bad memory":         {Options{Name: "x", Memory: "lots"}, []string{`--memory "lots": not a quantity`}},
		"zero memory":        {Options{Name: "x", Memory: "0"}, []string{`--memory "0": must be positive`}},
		"cores over 100":     {Options{Name: "x", Cores: 150}, []string{"--cores 150: must be between 0 and 100"}},
		"bad nvlink":         {Options{Name: "x", GPUs: 2, NVLink: "always"}, []string{`--nvlink "always": must be prefer or require`}},
		"nvlink one gpu":     {Options{Name: "x", NVLink: NVLinkRequire}, []string{"--nvlink require: needs --gpus 2 or more"}},
		"isolation on whole": {Options{Name: "x", Isolation: "MPS"}, []string{"--isolation and --compute-limit apply to shares"}},
		"several at once": {Options{Name: "x", Cores: -1, Memory: "x"}, []string{
			`--memory "x": not a quantity`, "--cores -1: must be between 0 and 100",
		}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Build(tc.opts)
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
	t.Run("two shares on distinct GPUs", func(t *testing.T) {
		tmpl := mustBuild(t, Options{Name: "d", GPUs: 2, Cores: 50})
		c := tmpl.Spec.Spec.Devices.Constraints
		if len(c) != 1 || c[0].DistinctAttribute == nil || *c[0].DistinctAttribute != "gpu.tessera.dev/uuid" {
			t.Errorf("want a distinctAttribute uuid constraint, got %+v", c)
		}
	})
}

func mustBuild(t *testing.T, opts Options) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	tmpl, err := Build(opts)
	if err != nil {
		t.Fatalf("Build(%+v): %v", opts, err)
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
