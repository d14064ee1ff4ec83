package plugin

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// TestPrepareFailureBeforePlanningOnClaim: a prepare that fails before any
// GPU is touched — a GpuConfig that does not decode, a computeLimit below
// the share's cores, a device this node does not have — is on the claim as
// a failure on the backend is: each of the claim's devices of this node has
// Ready=False/PrepareFailed naming the reason, and a PrepareFailed event
// names the claim. An allocation for another node's devices gets the event
// only: those status entries are that node's plugin's to write.
func TestPrepareFailureBeforePlanningOnClaim(t *testing.T) {
	for _, tc := range []struct {
		name       string
		results    []result
		configs    []config
		reason     string
		wantStatus []string // devices with a Ready=False entry
	}{
		{
			name:       "config does not decode",
			results:    []result{share("gpu", "gpu-1-shared", "s1", "8Gi", "10")},
			configs:    []config{claimConfig(gpuConfig(`"sharing":{"isolaton":"MPS"}`))},
			reason:     "isolaton",
			wantStatus: []string{"gpu-1-shared"},
		},
		{
			name:       "computeLimit below the cores",
			results:    []result{share("gpu", "gpu-1-shared", "s1", "8Gi", "40")},
			configs:    []config{claimConfig(gpuConfig(`"sharing":{"computeLimit":20}`))},
			reason:     "computeLimit",
			wantStatus: []string{"gpu-1-shared"},
		},
		{
			name:       "device unknown on the node",
			results:    []result{whole("gpu", "gpu-0"), whole("gpu", "gpu-99")},
			reason:     "unknown on node",
			wantStatus: []string{"gpu-0", "gpu-99"},
		},
		{
			name:    "allocation for another node",
			results: []result{{request: "gpu", device: "gpu-0", pool: "node-b"}},
			reason:  "the allocation is for another node",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c := newClaim("uid-p", tc.results, tc.configs...)
			client := fake.NewClientset(c.DeepCopy())
			inst := e.start(func(o *Options) { o.Client = client })
			r := prepare(t, inst.Plugin, c)
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.reason) {
				t.Fatalf("prepare: err %v, want one naming %q", r.Err, tc.reason)
			}
			var devices []string
			for _, en := range readStatus(t, client, c) {
				devices = append(devices, en.Device)
				if en.Conditions["Ready"] != "False/PrepareFailed" || !strings.Contains(en.Messages["Ready"], tc.reason) || en.Data != nil {
					t.Errorf("device %s: status %+v, want Ready=False/PrepareFailed naming %q, no attestation", en.Device, en, tc.reason)
				}
			}
			slices.Sort(devices)
			if !slices.Equal(devices, tc.wantStatus) {
				t.Errorf("status entries for %v, want %v", devices, tc.wantStatus)
			}
			wantEvent := "claim default/claim-uid-p: Warning PrepareFailed: "
			if !slices.ContainsFunc(e.events.List(), func(ev string) bool {
				return strings.HasPrefix(ev, wantEvent) && strings.Contains(ev, tc.reason)
			}) {
				t.Errorf("events %q, want %s… naming %q", e.events.List(), wantEvent, tc.reason)
			}
		})
	}
}
