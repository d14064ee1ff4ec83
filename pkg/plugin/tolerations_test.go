package plugin

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/pkg/model"
)

// TestPrepareRefusesToleratedInternalTaints: an allocation whose request
// tolerated a taint only the driver sets (not-lent, mig-in-use; by key or
// as every taint) is refused, naming the request and the taint, and
// nothing is left behind; the reclaim taint and every NoExecute taint stay
// tolerable, and adminAccess results are not checked.
func TestPrepareRefusesToleratedInternalTaints(t *testing.T) {
	tests := []struct {
		name        string
		tolerations []resourceapi.DeviceToleration
		adminAccess bool
		wantErr     string
	}{
		{name: "not-lent", tolerations: []resourceapi.DeviceToleration{{Key: model.NotLentTaintKey, Operator: resourceapi.DeviceTolerationOpExists}},
			wantErr: `request "gpu" tolerates the taint gpu.tessera.dev/not-lent`},
		{name: "mig-in-use by value", tolerations: []resourceapi.DeviceToleration{{Key: model.MIGInUseTaintKey, Operator: resourceapi.DeviceTolerationOpEqual, Value: model.MIGInUseOutsideTessera, Effect: resourceapi.DeviceTaintEffectNoSchedule}},
			wantErr: `request "gpu" tolerates the taint gpu.tessera.dev/mig-in-use`},
		{name: "every taint", tolerations: []resourceapi.DeviceToleration{{Operator: resourceapi.DeviceTolerationOpExists}},
			wantErr: `request "gpu" tolerates the taint gpu.tessera.dev/not-lent (toleration key "", operator Exists)`},
		{name: "reclaim and every NoExecute taint", tolerations: []resourceapi.DeviceToleration{
			{Key: model.ReclaimTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute},
			{Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute}}},
		{name: "adminAccess", adminAccess: true, tolerations: []resourceapi.DeviceToleration{{Key: model.NotLentTaintKey, Operator: resourceapi.DeviceTolerationOpExists}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			i := e.start(nil)
			claim := newClaim("uid-tol", []result{whole("gpu", "gpu-0")})
			r := &claim.Status.Allocation.Devices.Results[0]
			r.Tolerations = tc.tolerations
			if tc.adminAccess {
				admin := true
				r.AdminAccess = &admin
			}
			res := prepare(t, i.Plugin, claim)
			if tc.wantErr == "" {
				if res.Err != nil {
					t.Fatalf("prepare: %v", res.Err)
				}
				return
			}
			if res.Err == nil || !strings.Contains(res.Err.Error(), tc.wantErr) || !strings.Contains(res.Err.Error(), "device gpu-0") {
				t.Fatalf("prepare: %v, want an error with %q", res.Err, tc.wantErr)
			}
			e.assertClean(i)
		})
	}
}
