package helm

import (
	"strings"
	"testing"
)

// kubeletPlugin.dynamicMIG becomes --dynamic-mig, unset by default; the
// schema refuses what the plugin would refuse; mock profiles keep the mock's
// MIG instances in the plugin data directory.
func TestDynamicMIG(t *testing.T) {
	_, plugin := pluginDaemonSet(t)
	if v, ok := flagValue(plugin.Args, "dynamic-mig"); ok {
		t.Errorf("default: --dynamic-mig=%q, want none", v)
	}
	if _, ok := flagValue(plugin.Args, "mock-mig-state-file"); ok {
		t.Error("real GPUs get --mock-mig-state-file")
	}
	_, plugin = pluginDaemonSet(t, "--set", "kubeletPlugin.dynamicMIG={1,GPU-0c2066a0-4c86}")
	if v, _ := flagValue(plugin.Args, "dynamic-mig"); v != "1,GPU-0c2066a0-4c86" {
		t.Errorf("--dynamic-mig=%q", v)
	}
	_, plugin = pluginDaemonSet(t, "--set", "kubeletPlugin.mockProfile=hgx-h100-mig", "--set", "kubeletPlugin.dynamicMIG={all}")
	if v, _ := flagValue(plugin.Args, "dynamic-mig"); v != "all" {
		t.Errorf("--dynamic-mig=%q", v)
	}
	if v, _ := flagValue(plugin.Args, "mock-mig-state-file"); !strings.HasPrefix(v, "/var/lib/kubelet/plugins/") || !strings.HasSuffix(v, "/mock-mig-state.json") {
		t.Errorf("--mock-mig-state-file=%q, want it in the plugin data directory", v)
	}
	for _, bad := range []string{"gpu3", "-1", "01"} {
		if _, err := helm(t, "template", "tessera", chartDir, "--kube-version", kubeVersion, "--set", "kubeletPlugin.dynamicMIG={"+bad+"}"); err == nil {
			t.Errorf("dynamicMIG {%s} accepted", bad)
		}
	}
}
