//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tessera-dev/tessera/tests/e2e/framework"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/pkg/legacy"
	"github.com/tessera-dev/tessera/pkg/webhook/legacypods"
)

// TestLegacyTranslation is the end-to-end check of the translation at Pod
// CREATE: with the release switched to webhook.legacyTranslation.enabled
// and deviceClasses.nvidiaGPU.create (restored at the end), in namespaces
// labelled gpu.tessera.dev/translate-legacy=true, pods written as HAMi,
// gpushare, Koordinator and NVIDIA's device plugin document them run and see
// the GPUs and limits their translation asks for; admitting a pod again
// changes nothing; a Deployment's pods are translated; a translated request
// beside the pod's own claim works; a contradictory request is refused
// naming the field; a template is made by the webhook's controller only
// once the pod is stored (a dry run makes none), and the pod then starts;
// and a ResourceQuota on requests.nvidia.com/gpu counts device-plugin pods
// and refuses one over it.
func TestLegacyTranslation(t *testing.T) {
	c := needDriver(t, "gpu.tessera.dev", "shared.gpu.tessera.dev")
	framework.HelmUpgradeValues(t, c, map[string]any{
		"webhook":       map[string]any{"legacyTranslation": map[string]any{"enabled": true}},
		"deviceClasses": map[string]any{"nvidiaGPU": map[string]any{"create": true}},
	}, false)
	c.RequireDriver(t, legacy.DeviceClassName)
	ns := translatingNamespace(t, c, "e2e-legacy")
	waitForTranslation(t, c, ns)

	// The four pods stay until the end (the readmission and quota subtests
	// read them); the other subtests' pods go with their subtest.
	t.Run("EachSystemsPodRuns", func(st *testing.T) { legacyPodsRun(st, t, c, ns) })
	t.Run("ReadmissionChangesNothing", func(t *testing.T) { legacyReadmission(t, c, ns) })
	t.Run("DeploymentPodsTranslated", func(t *testing.T) { legacyDeployment(t, c, ns) })
	t.Run("TranslatedBesideOwnClaim", func(t *testing.T) { legacyBesideOwnClaim(t, c, ns) })
	t.Run("ContradictionRefused", func(t *testing.T) { legacyContradiction(t, c, ns) })
	t.Run("TemplateMadeForStoredPod", func(t *testing.T) { legacyTemplateFromPod(t, c, ns) })
	t.Run("QuotaCountsDevicePluginPods", func(t *testing.T) { legacyQuota(t, c) })
}

// The four pods of EachSystemsPodRuns, as each system's documentation
// writes them (pkg/legacy/names.go cites the sources), and what each one's
// translation asks for.
var legacySystemPods = []struct {
	name, system string
	limits       map[string]string // in resources.limits
	requests     map[string]string // in resources.requests
	// One device of the pod's claim: a share of memory and cores (the
	// consumed capacity; the container's cores limit is 100 when none are
	// requested), or a whole GPU (memory "").
	memory       string
	cores        int64
	devicePlugin bool // nvidia.com/gpu kept: a scheduler-made claim
}{
	// HAMi's README: nvidia.com/gpu: 1 vGPU with gpumem 3000 (MiB) and
	// gpucores 30 (percent).
	{name: "hami", system: "HAMi", limits: map[string]string{
		legacy.NvidiaGPU: "1", legacy.HAMiMemory: "3000", legacy.HAMiCores: "30",
	}, memory: "3000Mi", cores: 30},
	// gpushare's user guide: aliyun.com/gpu-mem in GiB (the chart's
	// default unit), no compute reserved.
	{name: "gpushare", system: "gpushare", limits: map[string]string{
		legacy.GPUShareMemory: "3",
	}, memory: "3Gi"},
	// Koordinator's fine-grained device scheduling proposal: half a GPU,
	// gpu-core and gpu-memory-ratio in requests. The template carries the
	// fraction annotation 1/2, which the claim webhook expands to half of an
	// H100 as the mock publishes it (81089Mi).
	{name: "koordinator", system: "Koordinator", requests: map[string]string{
		legacy.KoordCore: "50", legacy.KoordMemoryRatio: "50",
	}, memory: "40544Mi", cores: 50},
	// NVIDIA's device plugin: nvidia.com/gpu: 1, kept, served by the
	// DeviceClass nvidia-gpu.gpu.tessera.dev.
	{name: "device-plugin", system: "NVIDIA device plugin", limits: map[string]string{
		legacy.NvidiaGPU: "1",
	}, devicePlugin: true},
}

// legacyPodsRun creates the four pods at once; each runs, was rewritten as
// its system's translation says (no legacy name left but a kept
// nvidia.com/gpu, a claim from a Tessera-labelled template), was allocated
// what it asked for, and its container sees exactly that GPU and limits.
func legacyPodsRun(t *testing.T, owner testing.TB, c *framework.Cluster, ns string) {
	ctx := context.Background()
	for _, p := range legacySystemPods {
		createPod(t, owner, c, ns, legacyPod(p.name, p.limits, p.requests))
	}
	for _, p := range legacySystemPods {
		sp, err := c.WaitForEnvPod(ctx, ns, p.name)
		if err != nil {
			t.Errorf("%s pod: %v", p.system, err)
			continue
		}
		framework.LogSpecPod(t, sp)
		ctr := sp.Pod.Spec.Containers[0]
		if p.devicePlugin {
			checkDevicePluginPod(t, c, sp)
			continue
		}
		names := resourceNames(ctr.Resources)
		if slices.ContainsFunc(names, func(n string) bool { return legacy.IsLegacyResource(n) || n == legacy.NvidiaGPU }) {
			t.Errorf("%s pod %s: resources still name %v after translation", p.system, p.name, names)
		}
		tmpl := translatedTemplate(t, c, sp.Pod, legacy.ClaimName(false, 0))
		d := framework.ClaimOf(t, c, sp, legacy.ClaimName(false, 0))
		framework.WantConsumed(t, p.name, d, map[string]string{"memory": p.memory})
		limit := p.cores
		if q, ok := d.Result.ConsumedCapacity["cores"]; p.cores == 0 && ok && !q.IsZero() {
			t.Errorf("pod %s: consumed %s cores, want none", p.name, q.String())
		} else if p.cores != 0 {
			framework.WantConsumed(t, p.name, d, map[string]string{"cores": fmt.Sprint(p.cores)})
		}
		if limit == 0 {
			limit = 100 // no cores guaranteed: the share may use them all
		}
		want := framework.ShareGPU(t, d, p.memory, limit)
		framework.WantGPUs(t, "pod "+p.name, sp.Env, want)
		t.Logf("%s pod %s (%s): template %s, claim %s on %s consumed %v; the container saw %s",
			p.system, p.name, describeLegacy(p.limits, p.requests), tmpl, d.Result.Request, d.Result.Device,
			d.Result.ConsumedCapacity, gpuEnvLine(sp.Env, want.Minor))
	}
}

// checkDevicePluginPod: the device-plugin pod kept nvidia.com/gpu: 1 and
// reached no webhook (no resourceClaims); the scheduler made its claim from
// nvidia-gpu.gpu.tessera.dev, one whole GPU, which the container sees
// exactly, without limits.
func checkDevicePluginPod(t *testing.T, c *framework.Cluster, sp framework.SpecPod) {
	t.Helper()
	ctx := context.Background()
	ctr := sp.Pod.Spec.Containers[0]
	if q := ctr.Resources.Limits[legacy.NvidiaGPU]; q.Value() != 1 {
		t.Errorf("pod %s: limits %v, want nvidia.com/gpu: 1 kept", sp.Pod.Name, ctr.Resources.Limits)
	}
	if len(sp.Pod.Spec.ResourceClaims) != 0 {
		t.Errorf("pod %s: resourceClaims %+v, want none (plain nvidia.com/gpu is not translated)", sp.Pod.Name, sp.Pod.Spec.ResourceClaims)
	}
	ers := sp.Pod.Status.ExtendedResourceClaimStatus
	if ers == nil || ers.ResourceClaimName == "" {
		t.Errorf("pod %s has no status.extendedResourceClaimStatus: %+v", sp.Pod.Name, sp.Pod.Status)
		return
	}
	claim, err := c.Client.ResourceV1().ResourceClaims(sp.Pod.Namespace).Get(ctx, ers.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Error(err)
		return
	}
	var classes []string
	for _, r := range claim.Spec.Devices.Requests {
		if r.Exactly != nil {
			classes = append(classes, r.Exactly.DeviceClassName)
		}
	}
	if !slices.Equal(classes, []string{legacy.DeviceClassName}) {
		t.Errorf("pod %s: the scheduler's claim %s asks classes %v, want [%s]", sp.Pod.Name, claim.Name, classes, legacy.DeviceClassName)
	}
	devs, err := c.AllocatedDevices(ctx, sp.Pod.Namespace, ers.ResourceClaimName)
	if err != nil {
		t.Error(err)
		return
	}
	if len(devs) != 1 || devs[0].Attribute("type") != "gpu" {
		t.Errorf("pod %s: claim %s devices %+v, want one whole GPU", sp.Pod.Name, ers.ResourceClaimName, devs)
		return
	}
	want := framework.WholeGPU(t, devs[0])
	framework.WantGPUs(t, "pod "+sp.Pod.Name, sp.Env, want)
	framework.NoShareEnv(t, "pod "+sp.Pod.Name, sp.Env)
	t.Logf("device-plugin pod %s (limits nvidia.com/gpu: 1, kept): scheduler-made claim %s of class %s, whole GPU %s; the container saw %s",
		sp.Pod.Name, ers.ResourceClaimName, legacy.DeviceClassName, devs[0].Result.Device, gpuEnvLine(sp.Env, want.Minor))
}

// legacyReadmission: a server-side dry run of the HAMi pod as written gets
// the running pod's translation (same claim entries and resources, the same
// template) and changes no template; a dry run of the running, translated
// pod's own spec comes back with its claims, resources and annotations as
// they were.
func legacyReadmission(t *testing.T, c *framework.Cluster, ns string) {
	ctx := context.Background()
	running, err := c.Client.CoreV1().Pods(ns).Get(ctx, "hami", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the HAMi pod of EachSystemsPodRuns: %v", err)
	}
	before := templateVersions(t, c, ns)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	p := legacySystemPods[0]
	again, err := c.Client.CoreV1().Pods(ns).Create(ctx, legacyPod("hami-again", p.limits, p.requests), dry)
	if err != nil {
		t.Fatalf("dry run of the HAMi pod as written: %v", err)
	}
	if !equality.Semantic.DeepEqual(again.Spec.ResourceClaims, running.Spec.ResourceClaims) ||
		!equality.Semantic.DeepEqual(again.Spec.Containers[0].Resources, running.Spec.Containers[0].Resources) {
		t.Errorf("the HAMi pod admitted again: resourceClaims %+v, resources %+v; the running pod has %+v, %+v",
			again.Spec.ResourceClaims, again.Spec.Containers[0].Resources, running.Spec.ResourceClaims, running.Spec.Containers[0].Resources)
	}

	copyPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hami-translated-again", Labels: running.Labels, Annotations: running.Annotations},
		Spec:       *running.Spec.DeepCopy(),
	}
	copyPod.Spec.NodeName = ""
	readmitted, err := c.Client.CoreV1().Pods(ns).Create(ctx, copyPod, dry)
	if err != nil {
		t.Fatalf("dry run of the translated pod's spec: %v", err)
	}
	if !equality.Semantic.DeepEqual(readmitted.Spec.ResourceClaims, running.Spec.ResourceClaims) ||
		!equality.Semantic.DeepEqual(readmitted.Spec.Containers[0].Resources, running.Spec.Containers[0].Resources) ||
		!equality.Semantic.DeepEqual(readmitted.Annotations, running.Annotations) {
		t.Errorf("the translated pod admitted again changed: resourceClaims %+v, resources %+v, annotations %v; was %+v, %+v, %v",
			readmitted.Spec.ResourceClaims, readmitted.Spec.Containers[0].Resources, readmitted.Annotations,
			running.Spec.ResourceClaims, running.Spec.Containers[0].Resources, running.Annotations)
	}

	after := templateVersions(t, c, ns)
	if !maps.Equal(before, after) {
		t.Errorf("the dry runs changed the namespace's templates: %v before, %v after", before, after)
	}
	t.Logf("readmission: the HAMi pod as written dry-runs to the running pod's claims %s and resources %v; "+
		"the translated spec dry-runs unchanged; templates (name: resourceVersion) %v unchanged",
		claimEntries(running.Spec.ResourceClaims), running.Spec.Containers[0].Resources, after)
}

// legacyDeployment: a Deployment written with HAMi's names (2 replicas of
// nvidia.com/gpu: 1, gpumem: 2000, gpucores: 20) keeps them in its own
// template, and each pod its ReplicaSet creates is translated at CREATE to
// a claim from one shared template, runs and sees its share.
func legacyDeployment(t *testing.T, c *framework.Cluster, ns string) {
	ctx := context.Background()
	const name = "hami-deploy"
	limits := map[string]string{legacy.NvidiaGPU: "1", legacy.HAMiMemory: "2000", legacy.HAMiCores: "20"}
	podTemplate := legacyPod("", limits, nil)
	podTemplate.Labels["app"] = name
	replicas := int32(2)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: podTemplate.ObjectMeta, Spec: podTemplate.Spec},
		},
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := c.Client.AppsV1().Deployments(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup: delete Deployment %s: %v", name, err)
		}
	})
	var pods []corev1.Pod
	selector := labels.SelectorFromSet(labels.Set{"app": name}).String()
	err := framework.Poll(ctx, "the Deployment's 2 pods", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		pods = list.Items
		return len(pods) == 2, framework.Retry("%d pods", len(pods))
	})
	if err != nil {
		t.Fatal(err)
	}
	templates := map[string]bool{}
	for _, pod := range pods {
		sp, err := c.WaitForEnvPod(ctx, ns, pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		framework.LogSpecPod(t, sp)
		templates[translatedTemplate(t, c, sp.Pod, legacy.ClaimName(false, 0))] = true
		d := framework.ClaimOf(t, c, sp, legacy.ClaimName(false, 0))
		framework.WantConsumed(t, pod.Name, d, map[string]string{"memory": "2000Mi", "cores": "20"})
		want := framework.ShareGPU(t, d, "2000Mi", 20)
		framework.WantGPUs(t, "pod "+pod.Name, sp.Env, want)
		t.Logf("Deployment pod %s: claim on %s; the container saw %s", pod.Name, d.Result.Device, gpuEnvLine(sp.Env, want.Minor))
	}
	if len(templates) != 1 {
		t.Errorf("the Deployment's pods use templates %v, want one (equal shapes share a template)", slices.Sorted(maps.Keys(templates)))
	}
	got, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept := got.Spec.Template.Spec.Containers[0].Resources.Limits
	if _, ok := kept[legacy.HAMiMemory]; !ok || len(got.Spec.Template.Spec.ResourceClaims) != 0 {
		t.Errorf("the Deployment's own template changed: limits %v, resourceClaims %+v; only its pods are translated", kept, got.Spec.Template.Spec.ResourceClaims)
	}
	t.Logf("Deployment %s (%s): its template keeps HAMi's names, its 2 pods run from template %v",
		name, describeLegacy(limits, nil), slices.Sorted(maps.Keys(templates)))
}

// legacyBesideOwnClaim: one container with HAMi's names (gpumem 4000,
// gpucores 60) and the pod's own claim (a share of 8Gi and 50 cores: the two
// cannot fit one GPU's 100 cores): the translation appends its claim to the
// pod's, and the container sees exactly both GPUs with each share's limits.
func legacyBesideOwnClaim(t *testing.T, c *framework.Cluster, ns string) {
	ctx := context.Background()
	c.Apply(t, ns, framework.Claim{Name: "own", Memory: "8Gi", Cores: "50"}.Object())
	pod := legacyPod("mixed", map[string]string{legacy.NvidiaGPU: "1", legacy.HAMiMemory: "4000", legacy.HAMiCores: "60"}, nil)
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "mine", ResourceClaimName: ptr.To("own")}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "mine"}}
	created := createPod(t, t, c, ns, pod)
	wantEntries := []string{"mine", legacy.ClaimName(false, 0)}
	if got := claimEntryNames(created.Spec.ResourceClaims); !slices.Equal(got, wantEntries) {
		t.Errorf("pod mixed: resourceClaims %v, want %v", got, wantEntries)
	}
	var refs []string
	for _, r := range created.Spec.Containers[0].Resources.Claims {
		refs = append(refs, r.Name)
	}
	if !slices.Equal(refs, wantEntries) {
		t.Errorf("pod mixed: the container references claims %v, want %v", refs, wantEntries)
	}
	sp := c.EnvOf(ctx, t, ns, "mixed")
	own := framework.ClaimOf(t, c, sp, "mine")
	translated := framework.ClaimOf(t, c, sp, legacy.ClaimName(false, 0))
	framework.WantConsumed(t, "mixed", own, map[string]string{"memory": "8Gi", "cores": "50"})
	framework.WantConsumed(t, "mixed", translated, map[string]string{"memory": "4000Mi", "cores": "60"})
	a, b := framework.ShareGPU(t, own, "8Gi", 50), framework.ShareGPU(t, translated, "4000Mi", 60)
	framework.WantGPUs(t, "pod mixed", sp.Env, a, b)
	t.Logf("pod mixed: claims %v; own claim on %s, translated on %s; the container saw %s and %s",
		wantEntries, own.Result.Device, translated.Result.Device, gpuEnvLine(sp.Env, a.Minor), gpuEnvLine(sp.Env, b.Minor))
}

// legacyContradiction: gpumem and gpumem-percentage together are refused
// at create (422) with the field; no pod and no template is made.
func legacyContradiction(t *testing.T, c *framework.Cluster, ns string) {
	ctx := context.Background()
	before := templateVersions(t, c, ns)
	pod := legacyPod("contradictory", map[string]string{
		legacy.NvidiaGPU: "1", legacy.HAMiMemory: "3000", legacy.HAMiMemoryPercentage: "50",
	}, nil)
	_, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	const field = "spec.containers[0].resources.limits[nvidia.com/gpumem-percentage]"
	if err == nil {
		_ = c.DeletePodAndWait(ctx, ns, pod.Name)
		t.Fatal("a pod with both nvidia.com/gpumem and nvidia.com/gpumem-percentage was admitted")
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), field) {
		t.Fatalf("refused with %v; want 422 Invalid naming %s", err, field)
	}
	if _, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod contradictory: get after the refusal: %v, want NotFound", err)
	}
	if after := templateVersions(t, c, ns); !maps.Equal(before, after) {
		t.Errorf("the refused pod changed the namespace's templates: %v before, %v after", before, after)
	}
	t.Logf("contradictory pod (gpumem 3000 + gpumem-percentage 50) refused: %v", err)
}

// legacyTemplateFromPod: a HAMi pod of a shape no other pod of the test
// has (gpumem 1234, gpucores 12) dry-runs to a translated pod whose
// template does not exist: admission made none. Created for real, the pod
// carries the translation label and the record of what was removed; the
// webhook's controller creates the template (labelled as its own, annotated
// with the pod), the resourceclaim controller then the claim, and the pod
// runs with its share. The delays from the pod's creation to its template
// and to its running are logged.
func legacyTemplateFromPod(t *testing.T, c *framework.Cluster, ns string) {
	ctx := context.Background()
	limits := map[string]string{legacy.NvidiaGPU: "1", legacy.HAMiMemory: "1234", legacy.HAMiCores: "12"}
	dry, err := c.Client.CoreV1().Pods(ns).Create(ctx, legacyPod("fresh", limits, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if len(dry.Spec.ResourceClaims) != 1 || dry.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil {
		t.Fatalf("dry run: resourceClaims %+v, want one translated entry", dry.Spec.ResourceClaims)
	}
	name := *dry.Spec.ResourceClaims[0].ResourceClaimTemplateName
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("template %s after a dry run: %v, want NotFound (admission writes nothing)", name, err)
	}

	start := time.Now()
	created := createPod(t, t, c, ns, legacyPod("fresh", limits, nil))
	if created.Labels[legacy.LabelTranslated] != "true" || created.Annotations[legacy.AnnotationSource] == "" {
		t.Errorf("pod fresh: labels %v, annotations %v; want %s=true and %s", created.Labels, created.Annotations, legacy.LabelTranslated, legacy.AnnotationSource)
	}
	var tmplAfter time.Duration
	err = framework.Poll(ctx, "template "+name, framework.PodTimeout, func(ctx context.Context) (bool, error) {
		tmpl, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		tmplAfter = time.Since(start)
		if tmpl.Labels[legacypods.LabelAdmission] != "true" || !strings.HasPrefix(tmpl.Annotations[legacypods.AnnotationCreatedFor], "fresh (uid "+string(created.UID)+")") {
			t.Errorf("template %s: labels %v, annotations %v; want %s=true and made for pod fresh", name, tmpl.Labels, tmpl.Annotations, legacypods.LabelAdmission)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var claimAfter time.Duration
	err = framework.Poll(ctx, "the claim of pod fresh", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, "fresh", metav1.GetOptions{})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.ResourceClaimName != nil {
				claimAfter = time.Since(start)
				return true, nil
			}
		}
		return false, framework.Retry("status.resourceClaimStatuses %+v", pod.Status.ResourceClaimStatuses)
	})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := c.WaitForEnvPod(ctx, ns, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	runAfter := time.Since(start)
	d := framework.ClaimOf(t, c, sp, legacy.ClaimName(false, 0))
	framework.WantConsumed(t, "fresh", d, map[string]string{"memory": "1234Mi", "cores": "12"})
	want := framework.ShareGPU(t, d, "1234Mi", 12)
	framework.WantGPUs(t, "pod fresh", sp.Env, want)
	t.Logf("pod fresh (%s): template %s seen %v after the pod's creation, its claim %v after, its env read %v after; the container saw %s",
		describeLegacy(limits, nil), name, tmplAfter.Round(time.Millisecond), claimAfter.Round(time.Millisecond), runAfter.Round(time.Millisecond),
		gpuEnvLine(sp.Env, want.Minor))
}

// legacyQuota: in a translating namespace under a ResourceQuota of
// requests.nvidia.com/gpu: 1, a device-plugin pod is admitted, runs on a
// whole GPU and is counted (status.used 1); a second one is refused with
// the quota's message.
func legacyQuota(t *testing.T, c *framework.Cluster) {
	ctx := context.Background()
	ns := translatingNamespace(t, c, "e2e-legacy-quota")
	const quota, key = "gpus", corev1.ResourceName("requests." + legacy.NvidiaGPU)
	_, err := c.Client.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: quota},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{key: resource.MustParse("1")}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The quota admits nothing it has not computed: wait for status.hard.
	err = framework.Poll(ctx, "quota "+quota+" to be computed", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		q, err := c.Client.CoreV1().ResourceQuotas(ns).Get(ctx, quota, metav1.GetOptions{})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		_, ok := q.Status.Hard[key]
		return ok, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	limits := map[string]string{legacy.NvidiaGPU: "1"}
	createPod(t, t, c, ns, legacyPod("counted", limits, nil))
	sp := c.EnvOf(ctx, t, ns, "counted")
	checkDevicePluginPod(t, c, sp)
	var used resource.Quantity
	err = framework.Poll(ctx, "quota "+quota+" to count the pod", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		q, err := c.Client.CoreV1().ResourceQuotas(ns).Get(ctx, quota, metav1.GetOptions{})
		if err != nil {
			return false, framework.Retry("%v", err)
		}
		used = q.Status.Used[key]
		return used.Value() == 1, framework.Retry("used %s", used.String())
	})
	if err != nil {
		t.Fatal(err)
	}
	// The API server's quota admission reads the quota from its informer:
	// a pod admitted before it sees used=1 is deleted and created again.
	want := fmt.Sprintf("exceeded quota: %s, requested: %s=1, used: %s=1, limited: %s=1", quota, key, key, key)
	var refusal error
	admitted := 0
	err = framework.Poll(ctx, "the quota to refuse a second pod", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(ns).Create(ctx, legacyPod("over", limits, nil), metav1.CreateOptions{})
		if err != nil {
			refusal = err
			return true, nil
		}
		admitted++
		return false, c.DeletePodAndWait(ctx, ns, "over")
	})
	if err != nil {
		t.Fatalf("pods over the quota were admitted %d times: %v", admitted, err)
	}
	if !apierrors.IsForbidden(refusal) || !strings.Contains(refusal.Error(), want) {
		t.Fatalf("second pod refused with %v; want the quota's message %q", refusal, want)
	}
	t.Logf("quota %s=1: device-plugin pod counted (status.used %s=%s); the second refused: %v", key, key, used.String(), refusal)

	// Translation removes HAMi's nvidia.com/gpu with its other names (the
	// shares are claims): such a pod is not counted by this quota
	// (docs/migration.md, quotas). Logged, not asserted: what a quota on the
	// legacy names becomes is the GPU budget's part of issue 24.
	hami := legacySystemPods[0]
	dry, err := c.Client.CoreV1().Pods(ns).Create(ctx, legacyPod("hami-under-quota", hami.limits, nil),
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	t.Logf("observed: a HAMi vGPU pod (%s) with the quota full: dry run error %v, resources after translation %v",
		describeLegacy(hami.limits, nil), err, resourceNamesOf(dry))
}

// translatingNamespace is a test namespace labelled for translation.
func translatingNamespace(t *testing.T, c *framework.Cluster, prefix string) string {
	t.Helper()
	ns := c.Namespace(t, prefix)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, legacypods.NamespaceLabel)
	if _, err := c.Client.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// waitForTranslation waits until pods are translated in ns: helm's --wait
// returns when the webhook's new replicas are ready, but an old replica may
// still answer the API server for a moment. Five dry runs of the HAMi pod in
// a row must come back translated.
func waitForTranslation(t *testing.T, c *framework.Cluster, ns string) {
	t.Helper()
	p := legacySystemPods[0]
	inARow := 0
	err := framework.Poll(context.Background(), "the webhook to translate pods", framework.PodTimeout, func(ctx context.Context) (bool, error) {
		out, err := c.Client.CoreV1().Pods(ns).Create(ctx, legacyPod("probe", p.limits, p.requests),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err != nil:
			inARow = 0
			return false, framework.Retry("%v", err)
		case len(out.Spec.ResourceClaims) == 0:
			inARow = 0
			return false, framework.Retry("not translated: resources %v", out.Spec.Containers[0].Resources)
		}
		inARow++
		return inARow == 5, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// legacyPod is an env-printing pod (EnvCommand) whose one container has
// these limits and requests.
func legacyPod(name string, limits, requests map[string]string) *corev1.Pod {
	list := func(m map[string]string) corev1.ResourceList {
		if len(m) == 0 {
			return nil
		}
		out := corev1.ResourceList{}
		for k, v := range m {
			out[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		return out
	}
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tessera.dev/e2e": "true"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:      "ctr",
				Image:     framework.EnvImage,
				Command:   []string{"sh", "-c", framework.EnvCommand},
				Resources: corev1.ResourceRequirements{Limits: list(limits), Requests: list(requests)},
			}},
		},
	}
}

// createPod creates pod in ns, returns it as admitted, and deletes it
// (gracefully) when owner (t or a parent test) ends.
func createPod(t *testing.T, owner testing.TB, c *framework.Cluster, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	created, err := c.Client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	owner.Cleanup(func() {
		err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), created.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			owner.Errorf("cleanup: delete pod %s: %v", created.Name, err)
		}
	})
	return created
}

// translatedTemplate checks that the pod's claim entry refers to a
// ResourceClaimTemplate of its namespace that carries Tessera's
// translation labels, and returns its name.
func translatedTemplate(t *testing.T, c *framework.Cluster, pod *corev1.Pod, entry string) string {
	t.Helper()
	for _, pc := range pod.Spec.ResourceClaims {
		if pc.Name != entry {
			continue
		}
		if pc.ResourceClaimTemplateName == nil {
			t.Fatalf("pod %s: claim entry %s names no template", pod.Name, entry)
		}
		name := *pc.ResourceClaimTemplateName
		tmpl, err := c.Client.ResourceV1().ResourceClaimTemplates(pod.Namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: template %s: %v", pod.Name, name, err)
		}
		if tmpl.Labels[legacy.LabelTranslated] != "true" || tmpl.Labels[legacy.LabelManagedBy] != "tessera" {
			t.Errorf("pod %s: template %s labels %v, want %s=true and %s=tessera", pod.Name, name, tmpl.Labels, legacy.LabelTranslated, legacy.LabelManagedBy)
		}
		return name
	}
	t.Fatalf("pod %s has no claim entry %s: %+v", pod.Name, entry, pod.Spec.ResourceClaims)
	return ""
}

// templateVersions is every ResourceClaimTemplate of ns, name →
// resourceVersion.
func templateVersions(t *testing.T, c *framework.Cluster, ns string) map[string]string {
	t.Helper()
	list, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, tmpl := range list.Items {
		out[tmpl.Name] = tmpl.ResourceVersion
	}
	return out
}

// resourceNames lists the names in a container's limits and requests.
func resourceNames(r corev1.ResourceRequirements) []string {
	seen := map[string]bool{}
	for _, l := range []corev1.ResourceList{r.Limits, r.Requests} {
		for k := range l {
			seen[string(k)] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// resourceNamesOf is resourceNames of a pod's first container, nil for no pod.
func resourceNamesOf(pod *corev1.Pod) []string {
	if pod == nil || len(pod.Spec.Containers) == 0 {
		return nil
	}
	return resourceNames(pod.Spec.Containers[0].Resources)
}

func claimEntryNames(claims []corev1.PodResourceClaim) []string {
	var out []string
	for _, c := range claims {
		out = append(out, c.Name)
	}
	return out
}

// claimEntries prints a pod's claim entries: name→template.
func claimEntries(claims []corev1.PodResourceClaim) string {
	var out []string
	for _, c := range claims {
		ref := "?"
		switch {
		case c.ResourceClaimTemplateName != nil:
			ref = "template " + *c.ResourceClaimTemplateName
		case c.ResourceClaimName != nil:
			ref = "claim " + *c.ResourceClaimName
		}
		out = append(out, c.Name+"→"+ref)
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// describeLegacy prints a container's legacy resources as written.
func describeLegacy(limits, requests map[string]string) string {
	var parts []string
	for _, l := range []struct {
		what string
		m    map[string]string
	}{{"limits", limits}, {"requests", requests}} {
		for _, k := range slices.Sorted(maps.Keys(l.m)) {
			parts = append(parts, fmt.Sprintf("%s %s: %s", l.what, k, l.m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

// gpuEnvLine prints a container's variables of GPU minor.
func gpuEnvLine(env map[string]string, minor int) string {
	v := framework.GPUVar(minor)
	var parts []string
	for _, k := range []string{v, v + framework.MemoryLimitSuffix, v + framework.CoresLimitSuffix} {
		if val, ok := env[k]; ok {
			parts = append(parts, k+"="+val)
		}
	}
	return strings.Join(parts, " ")
}
