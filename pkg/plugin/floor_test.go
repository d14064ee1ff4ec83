package plugin

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// classConfig is a DeviceClass's config entry as the allocation carries it:
// the allocator copies each class config for the requests of that class.
func classConfig(raw string, requests ...string) config {
	return config{source: resourceapi.AllocationConfigSourceClass, requests: requests, raw: raw}
}

func gpuConfig(fields string) string {
	return `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig",` + fields + `}`
}

// TestFloorIsolation: a DeviceClass's sharing.allowedIsolations is a floor
// that claims can only make stricter. After the share's isolation is settled
// (claim > class > the node's --default-isolation), prepare refuses it unless
// the class allows it, names the isolation, who chose it and the class's list,
// and leaves nothing behind.
func TestFloorIsolation(t *testing.T) {
	pinned := classConfig(gpuConfig(`"sharing":{"isolation":"MPS","allowedIsolations":["MPS","HAMiCore"]}`), "gpu")
	floorOnly := classConfig(gpuConfig(`"sharing":{"allowedIsolations":["MPS","HAMiCore"]}`), "gpu")
	aShare := []result{share("gpu", "gpu-0-shared", "s-0", "8Gi", "20")}

	for _, tc := range []struct {
		name             string
		results          []result
		configs          []config
		defaultIsolation configapi.Isolation
		// want is the isolation the claim's shares get ("" for whole GPUs);
		// wantErr, when set, is the whole prepare error.
		want    configapi.Isolation
		wantErr string
	}{
		{
			name:    "class pins MPS: a claim without isolation gets it",
			results: aShare,
			configs: []config{pinned},
			want:    configapi.IsolationMPS,
		},
		{
			name:    "a claim may choose another allowed isolation",
			results: aShare,
			configs: []config{pinned, claimConfig(isolationConfig(configapi.IsolationHAMiCore), "gpu")},
			want:    configapi.IsolationHAMiCore,
		},
		{
			name:    "a claim asking for Advisory is refused",
			results: aShare,
			configs: []config{pinned, claimConfig(isolationConfig(configapi.IsolationAdvisory), "gpu")},
			wantErr: `device gpu-0-shared: request "gpu": isolation Advisory (set by the claim's config) is not allowed by ` +
				`the device class's config (allowed: MPS, HAMiCore); the claim may ask only for one of those, or leave sharing.isolation to the class`,
		},
		{
			name:    "a claim config for all requests counts too",
			results: aShare,
			configs: []config{pinned, claimConfig(isolationConfig(configapi.IsolationAdvisory))},
			wantErr: `device gpu-0-shared: request "gpu": isolation Advisory (set by the claim's config) is not allowed by ` +
				`the device class's config (allowed: MPS, HAMiCore); the claim may ask only for one of those, or leave sharing.isolation to the class`,
		},
		{
			name:    "the node's default fills in and is not allowed",
			results: aShare,
			configs: []config{floorOnly},
			wantErr: `device gpu-0-shared: request "gpu": isolation Advisory (the node's --default-isolation, as neither the claim's ` +
				`nor the class's config sets one) is not allowed by the device class's config (allowed: MPS, HAMiCore); ` +
				`the admin sets sharing.isolation in the class's config to one it allows, or the claim asks for one`,
		},
		{
			name:             "the node's default fills in and is allowed",
			results:          aShare,
			configs:          []config{floorOnly},
			defaultIsolation: configapi.IsolationHAMiCore,
			want:             configapi.IsolationHAMiCore,
		},
		{
			name:             "the node's default does not replace the class's isolation",
			results:          aShare,
			configs:          []config{pinned},
			defaultIsolation: configapi.IsolationAdvisory,
			want:             configapi.IsolationMPS,
		},
		{
			name:    "a class whose isolation is outside its own list",
			results: aShare,
			configs: []config{classConfig(gpuConfig(`"sharing":{"isolation":"Advisory","allowedIsolations":["MPS"]}`), "gpu")},
			wantErr: `device gpu-0-shared: request "gpu": isolation Advisory (set by the device class's config) is not allowed by ` +
				`the device class's config (allowed: MPS); the class's sharing.isolation must be one of its sharing.allowedIsolations`,
		},
		{
			name:    "several class configs: the isolation must be in every list",
			results: aShare,
			configs: []config{
				classConfig(gpuConfig(`"sharing":{"allowedIsolations":["MPS","HAMiCore"]}`), "gpu"),
				classConfig(gpuConfig(`"sharing":{"allowedIsolations":["HAMiCore","Advisory"]}`), "gpu"),
				claimConfig(isolationConfig(configapi.IsolationMPS), "gpu"),
			},
			wantErr: `device gpu-0-shared: request "gpu": isolation MPS (set by the claim's config) is not allowed by ` +
				`the device class's config (allowed: HAMiCore); the claim may ask only for one of those, or leave sharing.isolation to the class`,
		},
		{
			name:    "a claim config may not set allowedIsolations",
			results: aShare,
			configs: []config{
				pinned,
				claimConfig(gpuConfig(`"sharing":{"isolation":"Advisory","allowedIsolations":["Advisory"]}`), "gpu"),
			},
			wantErr: `device gpu-0-shared: request "gpu": config 1 (FromClaim, requests "gpu"): invalid GpuConfig: ` +
				`sharing.allowedIsolations: Forbidden: only a DeviceClass config may set it; a claim chooses sharing.isolation among the isolations its class allows`,
		},
		{
			name:    "the floor of another request's class does not apply",
			results: []result{share("notebook", "gpu-0-shared", "s-0", "8Gi", "20")},
			configs: []config{pinned, claimConfig(isolationConfig(configapi.IsolationAdvisory), "notebook")},
			want:    configapi.IsolationAdvisory,
		},
		{
			name:    "a subrequest's class floor applies to the claim config of its parent request",
			results: []result{share("gpu/small", "gpu-0-shared", "s-0", "8Gi", "20")},
			configs: []config{
				classConfig(gpuConfig(`"sharing":{"isolation":"MPS","allowedIsolations":["MPS"]}`), "gpu/small"),
				claimConfig(isolationConfig(configapi.IsolationHAMiCore), "gpu"),
			},
			wantErr: `device gpu-0-shared: request "gpu/small": isolation HAMiCore (set by the claim's config) is not allowed by ` +
				`the device class's config (allowed: MPS); the claim may ask only for one of those, or leave sharing.isolation to the class`,
		},
		{
			name:    "whole GPUs have no isolation backend: the floor does not apply",
			results: []result{whole("gpu", "gpu-2")},
			configs: []config{pinned, claimConfig(isolationConfig(configapi.IsolationAdvisory), "gpu")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			i := e.start(func(o *Options) { o.DefaultIsolation = tc.defaultIsolation })
			claim := newClaim("uid-floor", tc.results, tc.configs...)

			pl, planErr := i.planClaim(claim)
			r := prepare(t, i.Plugin, claim)
			if tc.wantErr != "" {
				if r.Err == nil || planErr == nil {
					t.Fatalf("prepared (plan error %v, prepare error %v); want %q", planErr, r.Err, tc.wantErr)
				}
				if planErr.Error() != tc.wantErr {
					t.Errorf("plan error:\n got: %s\nwant: %s", planErr, tc.wantErr)
				}
				if !strings.Contains(r.Err.Error(), tc.wantErr) {
					t.Errorf("prepare error:\n got: %s\nwant it to contain: %s", r.Err, tc.wantErr)
				}
				e.assertClean(i)
				return
			}
			if planErr != nil || r.Err != nil {
				t.Fatalf("plan error %v, prepare error %v; want the claim prepared", planErr, r.Err)
			}
			if pl.isolation != tc.want {
				t.Errorf("isolation %q, want %q", pl.isolation, tc.want)
			}
			mustUnprepare(t, i.Plugin, claim.UID)
			e.assertClean(i)
		})
	}
}

// TestFloorIsolationSetBy: who chose a request's isolation, which the
// floor's errors name and which decides whether the node's
// --default-isolation fills it in.
func TestFloorIsolationSetBy(t *testing.T) {
	mps := isolationConfig(configapi.IsolationMPS)
	limitOnly := gpuConfig(`"sharing":{"computeLimit":50}`)
	for _, tc := range []struct {
		name    string
		configs []config
		request string
		want    isolationSource
	}{
		{name: "nothing", request: "gpu", want: isolationFromNode},
		{name: "a config without isolation", configs: []config{classConfig(limitOnly), claimConfig(limitOnly)}, request: "gpu", want: isolationFromNode},
		{name: "class", configs: []config{classConfig(mps, "gpu"), claimConfig(limitOnly)}, request: "gpu", want: isolationFromClass},
		{name: "claim over class, whatever the order", configs: []config{claimConfig(mps), classConfig(mps, "gpu")}, request: "gpu", want: isolationFromClaim},
		{name: "another request's entries", configs: []config{classConfig(mps, "other"), claimConfig(mps, "other")}, request: "gpu", want: isolationFromNode},
		{name: "the parent's entry for a subrequest", configs: []config{claimConfig(mps, "gpu")}, request: "gpu/small", want: isolationFromClaim},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := newClaim("uid", nil, tc.configs...)
			if got := isolationSetBy(claim.Status.Allocation.Devices.Config, tc.request); got != tc.want {
				t.Errorf("isolationSetBy = %d, want %d", got, tc.want)
			}
		})
	}
}
