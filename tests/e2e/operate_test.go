//go:build e2e

package e2e

// Operating Tessera (docs/operating.md): /metrics agrees with what the
// scheduler allocated, `tessera status` shows every pod on its GPU, and every
// `tessera claim-template` command of the docs yields a template the API
// server accepts and the scheduler allocates.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// operateMetricsURL is the plugin's /metrics: on the local cluster the plugin
// runs in the host's network namespace and serves HTTPS on :9478
// (demo/clusters/local/overlay/values.yaml); scrapeMetrics sends a token.
func operateMetricsURL() string {
	if u := os.Getenv("TESSERA_E2E_METRICS_URL"); u != "" {
		return u
	}
	return "https://127.0.0.1:9478/metrics"
}

// metricsReaderClusterRole is the chart's ClusterRole for scrapers
// (templates/metrics-rbac.yaml, release tessera).
const metricsReaderClusterRole = "tessera-metrics-reader"

var (
	metricsTokenMu sync.Mutex
	metricsTokenV  string
	metricsTokenAt time.Time
)

// metricsToken is a token of the ServiceAccount tessera-e2e-metrics-reader in
// the install namespace, bound to the ClusterRole tessera-metrics-reader, as a
// Prometheus's would be; both are created on first use and left in place
// (later runs reuse them). Tokens last an hour and are renewed after 30
// minutes.
func metricsToken(ctx context.Context) (string, error) {
	metricsTokenMu.Lock()
	defer metricsTokenMu.Unlock()
	if metricsTokenV != "" && time.Since(metricsTokenAt) < 30*time.Minute {
		return metricsTokenV, nil
	}
	if cluster == nil {
		return "", fmt.Errorf("no cluster to get a metrics token from")
	}
	const sa = "tessera-e2e-metrics-reader"
	token, err := serviceAccountToken(ctx, cluster, sa, metricsReaderClusterRole)
	if err != nil {
		return "", err
	}
	metricsTokenV, metricsTokenAt = token, time.Now()
	return token, nil
}

// serviceAccountToken creates (if missing) ServiceAccount sa in the install
// namespace, binds it to clusterRole (if not empty) and returns a fresh
// one-hour token of it.
func serviceAccountToken(ctx context.Context, c *framework.Cluster, sa, clusterRole string) (string, error) {
	_, err := c.Client.CoreV1().ServiceAccounts(framework.InstallNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create ServiceAccount %s/%s: %w", framework.InstallNamespace, sa, err)
	}
	if clusterRole != "" {
		_, err = c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: sa},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: clusterRole},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: framework.InstallNamespace}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("bind ServiceAccount %s/%s to ClusterRole %s: %w", framework.InstallNamespace, sa, clusterRole, err)
		}
	}
	expiry := int64(3600)
	tr, err := c.Client.CoreV1().ServiceAccounts(framework.InstallNamespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of %s/%s: %w", framework.InstallNamespace, sa, err)
	}
	return tr.Status.Token, nil
}

// metricsClient talks to the plugin's metrics server, whose certificate is
// self-signed per pod: the test checks who may scrape, not the certificate.
var metricsClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // self-signed per pod
}

// getMetrics GETs url with token as bearer (none when empty).
func getMetrics(ctx context.Context, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var labelPattern = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// scrapeMetrics reads url as a scraper bound to tessera-metrics-reader does.
func scrapeMetrics(ctx context.Context, url string) ([]sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	token, err := metricsToken(ctx)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := metricsClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	var out []sample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		s := sample{name: line[:i], labels: map[string]string{}, value: v}
		if j := strings.IndexByte(line, '{'); j >= 0 && j < i {
			s.name = line[:j]
			for _, m := range labelPattern.FindAllStringSubmatch(line[j:i], -1) {
				s.labels[m[1]] = m[2]
			}
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func sumSamples(samples []sample, name string, match func(map[string]string) bool) (float64, []string) {
	var sum float64
	var lines []string
	for _, s := range samples {
		if s.name == name && (match == nil || match(s.labels)) {
			sum += s.value
			lines = append(lines, fmt.Sprintf("%s%v %v", s.name, s.labels, s.value))
		}
	}
	return sum, lines
}

// operateStatus mirrors internal/cli/clusterview's JSON (the CLI's -o json).
type operateStatus struct {
	Nodes []struct {
		Name string `json:"name"`
		GPUs []struct {
			Device               string `json:"device"`
			AllocatedMemoryBytes int64  `json:"allocatedMemoryBytes"`
			Healthy              bool   `json:"healthy"`
			Holders              []struct {
				Namespace string   `json:"namespace"`
				Claim     string   `json:"claim"`
				Pods      []string `json:"pods"`
				Device    string   `json:"device"`
			} `json:"holders"`
		} `json:"gpus"`
	} `json:"nodes"`
}

// TestOperateMetricsAndStatus runs the demo specs, then checks that the
// plugin's /metrics reports as allocated exactly the memory the scheduler
// allocated to the demo claims, and that `tessera status` lists every demo
// pod on the GPU its claim got.
func TestOperateMetricsAndStatus(t *testing.T) {
	cluster := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := cluster.Namespace(t, "e2e-operate")
	specs := []string{"10-quarter-gpu-shares.yaml", "20-whole-gpu.yaml", "30-nvlink-pair.yaml", "40-shared-claim-two-pods.yaml", "50-mps-share.yaml"}
	pods := map[string]framework.SpecPod{}
	for _, s := range specs {
		for name, p := range cluster.RunSpec(t, ns, framework.SpecPath(s)) {
			pods[name] = p
		}
	}

	// What the scheduler allocated, per claim of the demo, from the API.
	claims, err := cluster.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var demoMemory int64
	devicesOf := map[string][]framework.Allocated{} // claim → devices
	for _, c := range claims.Items {
		devs, err := cluster.AllocatedDevices(ctx, ns, c.Name)
		if err != nil {
			t.Fatal(err)
		}
		devicesOf[c.Name] = devs
		for _, d := range devs {
			demoMemory += d.Memory()
		}
	}
	t.Logf("demo: %d pods, %d claims, %s allocated (%d bytes)", len(pods), len(claims.Items),
		resource.NewQuantity(demoMemory, resource.BinarySI), demoMemory)

	// /metrics: the claims of this namespace add up to the same, and so do
	// the GPUs' allocated memory (no other test holds claims now).
	url := operateMetricsURL()
	var samples []sample
	err = framework.Poll(ctx, "the plugin's /metrics to report the demo claims", time.Minute, func(ctx context.Context) (bool, error) {
		s, err := scrapeMetrics(ctx, url)
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		samples = s
		got, _ := sumSamples(s, "tessera_claim_memory_bytes", func(l map[string]string) bool { return l["namespace"] == ns })
		if int64(got) != demoMemory {
			return false, framework.Retry("tessera_claim_memory_bytes{namespace=%s} sums to %v, want %d", ns, got, demoMemory)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gpuSum, gpuLines := sumSamples(samples, "tessera_gpu_allocated_memory_bytes", func(l map[string]string) bool { return true })
	clusterMemory := demoMemory
	all, err := cluster.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all.Items {
		if c.Namespace != ns && c.Status.Allocation != nil && len(c.Status.ReservedFor) > 0 {
			t.Logf("claim %s/%s of another test is allocated too", c.Namespace, c.Name)
			devs, err := cluster.AllocatedDevices(ctx, c.Namespace, c.Name)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range devs {
				clusterMemory += d.Memory()
			}
		}
	}
	if int64(gpuSum) != clusterMemory {
		t.Errorf("sum of tessera_gpu_allocated_memory_bytes = %v, want %d (the allocated claims' sum)\n%s", gpuSum, clusterMemory, strings.Join(gpuLines, "\n"))
	}
	for _, l := range gpuLines {
		if !strings.HasSuffix(l, " 0") {
			t.Logf("metrics: %s", l)
		}
	}
	t.Logf("metrics: sum(tessera_gpu_allocated_memory_bytes) = %.0f = the demo claims' %d", gpuSum, demoMemory)

	// tessera status: every demo pod appears on the GPU(s) its claim got.
	kubeconfig := framework.Kubeconfig(t)
	t.Logf("tessera status:\n%s", framework.RunCLI(t, "status", "--kubeconfig", kubeconfig))
	var st operateStatus
	if err := json.Unmarshal([]byte(framework.RunCLI(t, "status", "--kubeconfig", kubeconfig, "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	for name, p := range pods {
		for _, pc := range p.Pod.Spec.ResourceClaims {
			claim, err := framework.PodClaimName(p.Pod, pc.Name)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range devicesOf[claim] {
				gpuName := strings.TrimSuffix(d.Result.Device, "-shared")
				found := false
				for _, n := range st.Nodes {
					if n.Name != p.Pod.Spec.NodeName {
						continue
					}
					for _, g := range n.GPUs {
						if g.Device != gpuName {
							continue
						}
						for _, h := range g.Holders {
							if h.Namespace == ns && h.Claim == claim && h.Device == d.Result.Device && contains(h.Pods, name) {
								found = true
							}
						}
					}
				}
				if !found {
					t.Errorf("tessera status does not list pod %s/%s (claim %s) on %s %s", ns, name, claim, p.Pod.Spec.NodeName, gpuName)
				}
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// claimTemplateCommands are the `tessera claim-template` lines of
// docs/operating.md, with the arguments after the subcommand.
func claimTemplateCommands(t *testing.T) [][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(framework.RepoRoot, "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "tessera claim-template "); ok {
			if i := strings.Index(rest, "#"); i >= 0 {
				rest = rest[:i]
			}
			out = append(out, strings.Fields(rest))
		}
	}
	if len(out) < 5 {
		t.Fatalf("docs/operating.md has %d tessera claim-template commands, want at least 5: %v", len(out), out)
	}
	return out
}

// TestOperateClaimTemplateVariants applies every `tessera claim-template`
// command of docs/operating.md (whole, share, NVLink prefer and require, MPS)
// with a busybox pod using the template, and waits for each pod to run.
func TestOperateClaimTemplateVariants(t *testing.T) {
	cluster := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	ctx := context.Background()
	ns := cluster.Namespace(t, "e2e-templates")
	type variant struct{ name, pod string }
	var variants []variant
	for _, args := range claimTemplateCommands(t) {
		out := framework.RunCLI(t, append([]string{"claim-template"}, args...)...)
		objs, err := framework.DecodeYAML([]byte(out))
		if err != nil || len(objs) != 1 || objs[0].GetKind() != "ResourceClaimTemplate" {
			t.Fatalf("tessera claim-template %s printed %d objects (%v):\n%s", strings.Join(args, " "), len(objs), err, out)
		}
		name := objs[0].GetName()
		cluster.Apply(t, ns, objs...)
		pod := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": "tmpl-" + name},
			"spec": map[string]any{
				"terminationGracePeriodSeconds": int64(1),
				"resourceClaims":                []any{map[string]any{"name": "gpu", "resourceClaimTemplateName": name}},
				"containers": []any{map[string]any{
					"name": "ctr", "image": framework.EnvImage,
					"command":   []any{"sh", "-c", framework.EnvCommand},
					"resources": map[string]any{"claims": []any{map[string]any{"name": "gpu"}}},
				}},
			},
		}}
		cluster.Apply(t, ns, pod)
		variants = append(variants, variant{name: strings.Join(args, " "), pod: "tmpl-" + name})
	}
	for _, v := range variants {
		p, err := cluster.WaitForPodRunning(ctx, ns, v.pod)
		if err != nil {
			t.Errorf("tessera claim-template %s: %v", v.name, err)
			continue
		}
		log, err := cluster.WaitForLog(ctx, ns, v.pod, "ctr", framework.EnvDoneMarker)
		if err != nil {
			t.Errorf("tessera claim-template %s: %v", v.name, err)
			continue
		}
		claim, _ := framework.PodClaimName(p, "gpu")
		devs, err := cluster.AllocatedDevices(ctx, ns, claim)
		if err != nil {
			t.Errorf("tessera claim-template %s: %v", v.name, err)
			continue
		}
		// The container sees exactly the claim's GPUs; the limits are the
		// template's (checked by the other tests), logged here.
		env := framework.ParseEnv(log)
		want := map[int]string{}
		var names, limits []string
		for _, d := range devs {
			names = append(names, d.Result.Device)
			minor, err := framework.DeviceMinor(d.Result.Device)
			if err != nil {
				t.Errorf("tessera claim-template %s: %v", v.name, err)
				continue
			}
			want[minor] = d.Attribute("uuid")
			if m := env[framework.GPUVar(minor)+framework.MemoryLimitSuffix]; m != "" {
				limits = append(limits, fmt.Sprintf("%s: %s bytes, %s%% cores", d.Result.Device, m, env[framework.GPUVar(minor)+framework.CoresLimitSuffix]))
			}
		}
		got, err := framework.VisibleGPUs(env)
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("tessera claim-template %s: pod %s sees GPUs %s (%v); want exactly %s, its claim's", v.name, v.pod, framework.GPUList(got), err, framework.GPUList(want))
		}
		t.Logf("tessera claim-template %s: pod %s runs on %v, sees %s, limits %v",
			v.name, v.pod, names, framework.GPUList(got), limits)
	}
}
