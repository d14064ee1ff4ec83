package webhook

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// TestValidateDeviceClaimTolerations: a request may not tolerate the taints
// only Tessera sets (not-lent, mig-in-use), by key with any operator and
// value, nor every taint at once in a request for Tessera's devices; the
// reclaim taint (NoExecute) and other taints stay tolerable, and so does
// anything in a request with adminAccess or of another driver's class.
func TestValidateDeviceClaimTolerations(t *testing.T) {
	notLent := func(path, request string) string {
		return path + `: Forbidden: request "` + request + `" tolerates the taint gpu.tessera.dev/not-lent, which only gpu.tessera.dev sets: ` +
			`it keeps borrowers off a GPU whose owner does not lend it now; tolerate the taints you mean by their keys instead`
	}
	tests := []struct {
		name       string
		devices    string
		wantErrors []string
	}{
		{
			name: "a borrower tolerating not-lent",
			devices: `
requests:
- name: borrow
  exactly:
    deviceClassName: lent.gpu.tessera.dev
    tolerations: [{key: gpu.tessera.dev/not-lent, operator: Exists, effect: NoSchedule}]`,
			wantErrors: []string{notLent("spec.devices.requests[0].exactly.tolerations[0]", "borrow")},
		},
		{
			name: "by value, without an effect",
			devices: `
requests:
- name: borrow
  exactly:
    deviceClassName: lent.gpu.tessera.dev
    tolerations: [{key: gpu.tessera.dev/reclaim, operator: Exists, effect: NoExecute, tolerationSeconds: 30}, {key: gpu.tessera.dev/not-lent, operator: Equal, value: OwnerBusy}]`,
			wantErrors: []string{notLent("spec.devices.requests[0].exactly.tolerations[1]", "borrow")},
		},
		{
			name: "mig-in-use in a firstAvailable alternative",
			devices: `
requests:
- name: gpu
  firstAvailable:
  - {name: whole, deviceClassName: gpu.tessera.dev}
  - name: mig
    deviceClassName: mig.gpu.tessera.dev
    tolerations: [{key: gpu.tessera.dev/mig-in-use, operator: Exists}]`,
			wantErrors: []string{`spec.devices.requests[0].firstAvailable[1].tolerations[0]: Forbidden: request "gpu/mig" tolerates the taint gpu.tessera.dev/mig-in-use, ` +
				`which only gpu.tessera.dev sets: it keeps claims off a MIG instance that runs processes no claim accounts for; tolerate the taints you mean by their keys instead`},
		},
		{
			name: "every taint, in a share request",
			devices: `
requests:
- name: share
  exactly:
    deviceClassName: shared.gpu.tessera.dev
    capacity: {requests: {memory: 1Gi}}
    tolerations: [{operator: Exists}]`,
			wantErrors: []string{`spec.devices.requests[0].exactly.tolerations[0]: Forbidden: request "share" tolerates the taint gpu.tessera.dev/not-lent ` +
				`(a toleration without a key and with operator Exists tolerates every taint), which only gpu.tessera.dev sets: it keeps borrowers off a GPU whose owner does not lend it now; tolerate the taints you mean by their keys instead`},
		},
		{
			name: "every NoExecute taint, the health taint, the reclaim taint: allowed",
			devices: `
requests:
- name: whole
  exactly:
    deviceClassName: gpu.tessera.dev
    tolerations: [{operator: Exists, effect: NoExecute}, {key: gpu.tessera.dev/unhealthy, operator: Exists}, {key: gpu.tessera.dev/reclaim, operator: Exists}]`,
		},
		{
			name: "adminAccess: allowed",
			devices: `
requests:
- name: observe
  exactly:
    deviceClassName: mig.gpu.tessera.dev
    adminAccess: true
    tolerations: [{key: gpu.tessera.dev/mig-in-use, operator: Exists}]`,
		},
		{
			name: "every taint in another driver's request: allowed; Tessera's key there: refused",
			devices: `
requests:
- name: nic
  exactly:
    deviceClassName: nic.example.com
    tolerations: [{operator: Exists}, {key: gpu.tessera.dev/not-lent, operator: Exists}]`,
			wantErrors: []string{notLent("spec.devices.requests[0].exactly.tolerations[1]", "nic")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := ValidateDeviceClaimWithClasses(decodeDevices(t, tc.devices), field.NewPath("spec", "devices"),
				DeviceClassMap(map[string]*resourceapi.DeviceClass{}))
			checkErrors(t, errs, tc.wantErrors)
		})
	}
}
