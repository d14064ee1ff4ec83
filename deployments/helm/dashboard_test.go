package helm

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/prometheus/prometheus/model/labels"
	promql "github.com/prometheus/prometheus/promql/parser"
)

const dashboardFile = "tessera/dashboards/tessera.json"

// metricNameLabel is the label a selector such as {__name__="x"} names its metric
// with (prometheus's labels.MetricName, which is deprecated).
const metricNameLabel = "__name__"

// registeredMetrics returns the metric names pkg/metrics registers, read
// from its source: the first argument of every prometheus.NewDesc and the
// Name of every prometheus.*Opts literal. A histogram's value is true: its
// series are <name>_bucket, _sum and _count.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../../pkg/metrics/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("pkg/metrics sources: %v (%d files)", err, len(files))
	}
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
					if name, ok := stringLit(n.Args[0]); ok {
						out[name] = false
					}
				}
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
					return true
				}
				for _, e := range n.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if key, _ := kv.Key.(*ast.Ident); ok && key != nil && key.Name == "Name" {
						if name, ok := stringLit(kv.Value); ok {
							out[name] = sel.Sel.Name == "HistogramOpts"
						}
					}
				}
			}
			return true
		})
	}
	// The extractor must find what the docs list; if pkg/metrics changes
	// how it names metrics, this says so instead of passing on nothing.
	for _, name := range []string{"tessera_gpu_memory_bytes", "tessera_prepare_duration_seconds", "tessera_gpu_lending_phase", "tessera_lending_reclaims_total"} {
		if _, ok := out[name]; !ok {
			t.Fatalf("metric %s not found in pkg/metrics by the extractor (found %d: %v)", name, len(out), out)
		}
	}
	return out
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// known reports whether a series name is one pkg/metrics exports.
func known(registered map[string]bool, name string) bool {
	if _, ok := registered[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && registered[base] {
			return true
		}
	}
	return false
}

type dashboardPanel struct {
	Title   string           `json:"title"`
	Type    string           `json:"type"`
	Panels  []dashboardPanel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type dashboard struct {
	Title      string           `json:"title"`
	UID        string           `json:"uid"`
	Panels     []dashboardPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) (dashboard, []byte) {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d, data
}

// grafanaVars are Grafana's interval variables, which PromQL cannot parse,
// replaced by a duration before parsing.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// TestDashboardQueries: every panel's PromQL parses, and every metric it
// reads is one pkg/metrics exports; the panels cover what operators look
// at (allocation, per-pod memory, prepare latency, health, lending,
// enforcement).
func TestDashboardQueries(t *testing.T) {
	registered := registeredMetrics(t)
	d, _ := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard without title or uid: %q %q", d.Title, d.UID)
	}
	used := map[string]bool{}
	var walk func(panels []dashboardPanel)
	walk = func(panels []dashboardPanel) {
		for _, p := range panels {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, target := range p.Targets {
				expr, err := promql.ParseExpr(grafanaVars.Replace(target.Expr))
				if err != nil {
					t.Errorf("panel %q: %q: %v", p.Title, target.Expr, err)
					continue
				}
				promql.Inspect(expr, func(n promql.Node, _ []promql.Node) error {
					vs, ok := n.(*promql.VectorSelector)
					if !ok {
						return nil
					}
					name := vs.Name
					for _, m := range vs.LabelMatchers {
						if m.Name == metricNameLabel && m.Type == labels.MatchEqual {
							name = m.Value
						}
					}
					if !known(registered, name) {
						t.Errorf("panel %q reads %s, which pkg/metrics does not export", p.Title, name)
					}
					used[name] = true
					return nil
				})
			}
		}
	}
	walk(d.Panels)
	// Template variables' label_values(metric, label).
	labelValues := regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	for _, v := range d.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil && !known(registered, m[1]) {
			t.Errorf("variable %s reads %s, which pkg/metrics does not export", v.Name, m[1])
		}
	}
	for _, want := range []string{
		"tessera_gpu_allocated_memory_bytes", "tessera_gpu_memory_bytes", "tessera_gpu_allocated_cores", "tessera_gpu_cores",
		"tessera_gpu_shares", "tessera_pod_gpu_memory_used_bytes", "tessera_prepare_duration_seconds_bucket", "tessera_gpu_healthy",
		"tessera_gpu_lending_phase", "tessera_gpu_lendable_bytes", "tessera_lending_reclaims_total", "tessera_lending_reclaim_seconds_bucket",
		"tessera_claim_limit_enforced",
	} {
		if !used[want] {
			t.Errorf("no panel reads %s", want)
		}
	}
}

// TestDashboardConfigMap: off by default; on, one ConfigMap with the
// sidecar's label whose tessera.json is the dashboard file.
func TestDashboardConfigMap(t *testing.T) {
	dashboards := func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
		return slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool {
			return o.GetKind() != "ConfigMap" || !strings.HasSuffix(o.GetName(), "-dashboards")
		})
	}
	if got := dashboards(objects(t, render(t))); len(got) != 0 {
		t.Errorf("dashboards.enabled unset (default false): %d dashboard ConfigMaps rendered", len(got))
	}
	objs := dashboards(objects(t, render(t, "--set", "dashboards.enabled=true", "--set", "dashboards.namespace=monitoring",
		"--set", "dashboards.annotations.grafana_folder=GPUs")))
	if len(objs) != 1 {
		t.Fatalf("dashboards.enabled=true: %d dashboard ConfigMaps, want 1", len(objs))
	}
	cm := find[corev1.ConfigMap](t, objs, "ConfigMap", objs[0].GetName())
	if cm.Namespace != "monitoring" || cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "GPUs" {
		t.Errorf("ConfigMap %s/%s labels %v annotations %v: want namespace monitoring, grafana_dashboard=1, grafana_folder=GPUs",
			cm.Namespace, cm.Name, cm.Labels, cm.Annotations)
	}
	_, data := loadDashboard(t)
	if got := cm.Data["tessera.json"]; got != strings.TrimSpace(string(data)) {
		t.Errorf("ConfigMap's tessera.json (%d bytes) is not %s (%d bytes)", len(got), dashboardFile, len(data))
	}
}
