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
	if v, _ := flagValue(plugin.Args, "mock-mig-state-file"); !strings.HasPrefix(v, "/var/lib/kubelet/plugins/") || !strings.HasSuffix(v, "/mock-mig-state-hgx-h100-mig.json") {
		t.Errorf("--mock-mig-state-file=%q, want the profile's file in the plugin data directory", v)
	}
	for _, bad := range []string{"gpu3", "-1", "01"} {
		if _, err := helm(t, "template", "tessera", chartDir, "--kube-version", kubeVersion, "--set", "kubeletPlugin.dynamicMIG={"+bad+"}"); err == nil {
			t.Errorf("dynamicMIG {%s} accepted", bad)
		}
	}
}

// TestExtraEnv: kubeletPlugin.extraEnv reaches the plugin container before
// the chart's own variables, which therefore win over a duplicate.
func TestExtraEnv(t *testing.T) {
	_, plugin := pluginDaemonSet(t, "--set", "kubeletPlugin.extraEnv[0].name=HTTPS_PROXY", "--set", "kubeletPlugin.extraEnv[0].value=http://proxy:3128")
	if len(plugin.Env) < 2 || plugin.Env[0].Name != "HTTPS_PROXY" || plugin.Env[0].Value != "http://proxy:3128" {
		t.Fatalf("env %+v, want HTTPS_PROXY first", plugin.Env)
	}
	if _, err := helm(t, "template", "tessera", chartDir, "--kube-version", kubeVersion, "--set", "kubeletPlugin.extraEnv[0].value=x"); err == nil {
		t.Error("an extraEnv entry without a name was accepted")
	}
}
