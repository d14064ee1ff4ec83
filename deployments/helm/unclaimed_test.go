package helm

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestAllowVisibleDevicesEnvvar: kubeletPlugin.allowVisibleDevicesEnvvar
// reaches a real node's plugin as --allow-visible-devices-envvar, and only
// when set: by default a node whose NVIDIA runtime honours
// NVIDIA_VISIBLE_DEVICES from unprivileged containers is published tainted.
func TestAllowVisibleDevicesEnvvar(t *testing.T) {
	for name, tc := range map[string]struct {
		set  []string
		want bool
	}{
		"default":          {nil, false},
		"allowed":          {[]string{"--set", "kubeletPlugin.allowVisibleDevicesEnvvar=true"}, true},
		"explicitly false": {[]string{"--set", "kubeletPlugin.allowVisibleDevicesEnvvar=false"}, false},
		"mock":             {[]string{"--set", "kubeletPlugin.mockProfile=l4x4,kubeletPlugin.allowVisibleDevicesEnvvar=true"}, false},
	} {
		ds := find[appsv1.DaemonSet](t, objects(t, render(t, tc.set...)), "DaemonSet", "tessera-kubelet-plugin")
		if got := slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--allow-visible-devices-envvar"); got != tc.want {
			t.Errorf("%s: --allow-visible-devices-envvar in the plugin's args: %v, want %v", name, got, tc.want)
		}
	}
}
