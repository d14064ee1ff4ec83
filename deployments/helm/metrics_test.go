package helm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/deployments/helm/pluginflags"
	"github.com/tessera-dev/tessera/pkg/health"
)

// chartValues is the part of values.yaml these tests read.
type chartValues struct {
	KubeletPlugin struct {
		Metrics struct {
			Port int `json:"port"`
		} `json:"metrics"`
		Health struct {
			Enabled        bool     `json:"enabled"`
			FatalEffect    string   `json:"fatalEffect"`
			RecoveryPeriod string   `json:"recoveryPeriod"`
			IgnoredXIDs    []uint64 `json:"ignoredXIDs"`
			FatalXIDs      []uint64 `json:"fatalXIDs"`
		} `json:"health"`
	} `json:"kubeletPlugin"`
}

// TestHealthDefaultsMatchPlugin: the chart's health defaults are the plugin's
// own (pkg/health.DefaultPolicy), so installing with the chart changes nothing
// over running the plugin with no --health-* flag.
func TestHealthDefaultsMatchPlugin(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v chartValues
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	h := v.KubeletPlugin.Health
	want := health.DefaultPolicy()
	if !h.Enabled {
		t.Error("kubeletPlugin.health.enabled: false, the plugin's --health defaults to true")
	}
	if diff := cmp.Diff(want.IgnoredXIDs, h.IgnoredXIDs); diff != "" {
		t.Errorf("kubeletPlugin.health.ignoredXIDs (-health.DefaultIgnoredXIDs +chart):\n%s", diff)
	}
	if diff := cmp.Diff(want.FatalXIDs, h.FatalXIDs); diff != "" {
		t.Errorf("kubeletPlugin.health.fatalXIDs (-health.DefaultFatalXIDs +chart):\n%s", diff)
	}
	if h.FatalEffect != string(want.FatalEffect) {
		t.Errorf("kubeletPlugin.health.fatalEffect %q, the plugin's default is %q", h.FatalEffect, want.FatalEffect)
	}
	if d, err := time.ParseDuration(h.RecoveryPeriod); err != nil || d != want.RecoveryPeriod {
		t.Errorf("kubeletPlugin.health.recoveryPeriod %q (%v), the plugin's default is %v", h.RecoveryPeriod, err, want.RecoveryPeriod)
	}
	// The plugin's --metrics-address default is :9477 (cmd/tessera-kubelet-plugin).
	if v.KubeletPlugin.Metrics.Port != 9477 {
		t.Errorf("kubeletPlugin.metrics.port %d, the plugin's default address is :9477", v.KubeletPlugin.Metrics.Port)
	}
}

// TestHealthEffectsFollowTheCode: the schema's fatalEffect enum is exactly the
// effects health.Policy accepts.
func TestHealthEffectsFollowTheCode(t *testing.T) {
	root, _ := loadSchema(t)
	enum := stringValues(root.Properties["kubeletPlugin"].Properties["health"].Properties["fatalEffect"].Enum)
	for _, e := range enum {
		if err := (health.Policy{FatalEffect: resourceapi.DeviceTaintEffect(e)}).Validate(); err != nil {
			t.Errorf("fatalEffect %q in the schema: %v", e, err)
		}
	}
	want := []string{
		string(resourceapi.DeviceTaintEffectNoExecute),
		string(resourceapi.DeviceTaintEffectNoSchedule),
		string(resourceapi.DeviceTaintEffectNone),
	}
	if diff := cmp.Diff(want, enum); diff != "" {
		t.Errorf("kubeletPlugin.health.fatalEffect enum (-code +schema):\n%s", diff)
	}
}

func pluginDaemonSet(t *testing.T, args ...string) (*appsv1.DaemonSet, corev1.Container) {
	t.Helper()
	ds := find[appsv1.DaemonSet](t, objects(t, render(t, args...)), "DaemonSet", "tessera-kubelet-plugin")
	return ds, ds.Spec.Template.Spec.Containers[0]
}

// flagValue returns the value of --name=value in args.
var flagValue = pluginflags.Value

// TestPluginMetricsAndHealth: the DaemonSet's flags, port, probe and hostPID
// follow kubeletPlugin.metrics and kubeletPlugin.health.
func TestPluginMetricsAndHealth(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		ds, c := pluginDaemonSet(t)
		want := map[string]string{
			"metrics-address":        ":9477",
			"health":                 "true",
			"health-fatal-effect":    "NoExecute",
			"health-recovery-period": "5m",
			"health-ignored-xids":    "13,31,43,45,68,109",
			"health-fatal-xids":      "48,64,79,95,119,120,140",
		}
		for name, v := range want {
			if got, ok := flagValue(c.Args, name); !ok || got != v {
				t.Errorf("--%s=%q (set: %v), want %q", name, got, ok, v)
			}
		}
		if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 9477 }) {
			t.Errorf("no containerPort metrics 9477: %+v", c.Ports)
		}
		if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "metrics" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("livenessProbe %+v, want GET /healthz on port metrics over HTTPS", p)
		}
		// Host PIDs come from the host's /proc mounted read-only
		// (security_test.go), not from the host's PID namespace.
		if ds.Spec.Template.Spec.HostPID {
			t.Error("hostPID on real GPUs by default")
		}
	})
	t.Run("mock", func(t *testing.T) {
		ds, _ := pluginDaemonSet(t, "--set", "kubeletPlugin.mockProfile=hgx-h100")
		if ds.Spec.Template.Spec.HostPID {
			t.Error("hostPID with a mock profile")
		}
	})
	t.Run("hostNetwork", func(t *testing.T) {
		// A declared port is a host port there: the surge pod would not fit.
		_, c := pluginDaemonSet(t, "--set", "kubeletPlugin.hostNetwork=true")
		if len(c.Ports) != 0 {
			t.Errorf("ports on the host network: %+v", c.Ports)
		}
		if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntValue() != 9477 {
			t.Errorf("livenessProbe %+v, want GET /healthz on 9477", p)
		}
	})
	t.Run("metrics disabled", func(t *testing.T) {
		ds, c := pluginDaemonSet(t, "--set", "kubeletPlugin.metrics.enabled=false", "--set", "kubeletPlugin.metrics.serviceMonitor.enabled=true")
		if v, ok := flagValue(c.Args, "metrics-address"); !ok || v != "" {
			t.Errorf("--metrics-address=%q (set: %v), want it empty", v, ok)
		}
		if len(c.Ports) != 0 || c.LivenessProbe != nil || ds.Spec.Template.Spec.HostPID {
			t.Errorf("ports %+v, livenessProbe %+v, hostPID %v without metrics", c.Ports, c.LivenessProbe, ds.Spec.Template.Spec.HostPID)
		}
		for _, o := range objects(t, render(t, "--set", "kubeletPlugin.metrics.enabled=false", "--set", "kubeletPlugin.metrics.serviceMonitor.enabled=true")) {
			if o.GetKind() == "ServiceMonitor" || o.GetKind() == "Service" && strings.HasSuffix(o.GetName(), "-metrics") {
				t.Errorf("%s %s rendered without metrics", o.GetKind(), o.GetName())
			}
		}
	})
	t.Run("health disabled", func(t *testing.T) {
		_, c := pluginDaemonSet(t, "--set", "kubeletPlugin.health.enabled=false")
		if v, _ := flagValue(c.Args, "health"); v != "false" {
			t.Errorf("--health=%q, want false", v)
		}
	})
	t.Run("serviceMonitor", func(t *testing.T) {
		objs := objects(t, render(t, "-f", "testdata/values-servicemonitor.yaml"))
		svc := find[corev1.Service](t, objs, "Service", "tessera-kubelet-plugin-metrics")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("metrics Service clusterIP %q, want headless", svc.Spec.ClusterIP)
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].Port != 9478 {
			t.Errorf("metrics Service ports %+v", svc.Spec.Ports)
		}
		ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "tessera-kubelet-plugin")
		for k, v := range svc.Spec.Selector {
			if ds.Spec.Template.Labels[k] != v {
				t.Errorf("metrics Service selector %s=%s does not select the plugin pods", k, v)
			}
		}
		found := false
		for _, o := range objs {
			if o.GetKind() != "ServiceMonitor" {
				continue
			}
			found = true
			if o.GetAPIVersion() != "monitoring.coreos.com/v1" {
				t.Errorf("ServiceMonitor apiVersion %s", o.GetAPIVersion())
			}
			if o.GetLabels()["release"] != "kube-prometheus-stack" {
				t.Errorf("ServiceMonitor labels %v lack serviceMonitor.labels", o.GetLabels())
			}
			match, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
			for k, v := range match {
				if svc.Labels[k] != v {
					t.Errorf("ServiceMonitor selector %s=%s does not select the metrics Service", k, v)
				}
			}
			data, _ := yaml.Marshal(o.Object)
			for _, want := range []string{"port: metrics", "interval: 15s", "__meta_kubernetes_pod_node_name", "targetLabel: instance"} {
				if !strings.Contains(string(data), want) {
					t.Errorf("ServiceMonitor lacks %q:\n%s", want, data)
				}
			}
		}
		if !found {
			t.Error("no ServiceMonitor rendered")
		}
	})
}
