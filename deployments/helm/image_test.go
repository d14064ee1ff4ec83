package helm

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apiserver/pkg/admission"

	"github.com/tessera-dev/tessera/pkg/isolation"
)

const (
	pluginDigest  = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	webhookDigest = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	hamiDigest    = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
)

// TestImageDigests: an image's digest, when set, makes its reference
// repository@digest with the tag ignored, for every image the chart runs or
// has the plugin run: the plugin, the MPS control daemon pods (the plugin's
// image unless mps.image is set, and the MPS pod policy admits exactly that
// reference), the webhook, the locality controller and HAMi-core's
// installer. Without a digest the references stay repository:tag.
func TestImageDigests(t *testing.T) {
	images := func(t *testing.T, args ...string) map[string]string {
		t.Helper()
		objs := objects(t, render(t, append([]string{"--set", "locality.enabled=true,kubeletPlugin.hamiCore.image.repository=example.com/hami,kubeletPlugin.hamiCore.image.tag=v2"}, args...)...))
		ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "tessera-kubelet-plugin")
		plugin := ds.Spec.Template.Spec.Containers[0]
		mps, _ := flagValue(plugin.Args, "mps-image")
		out := map[string]string{
			"plugin":   plugin.Image,
			"mps":      mps,
			"webhook":  find[appsv1.Deployment](t, objs, "Deployment", "tessera-webhook").Spec.Template.Spec.Containers[0].Image,
			"locality": find[appsv1.Deployment](t, objs, "Deployment", "tessera-locality").Spec.Template.Spec.Containers[0].Image,
		}
		for _, c := range ds.Spec.Template.Spec.InitContainers {
			if strings.Contains(c.Image, "example.com/hami") {
				out["hami"] = c.Image
			}
		}
		return out
	}
	check := func(t *testing.T, got, want map[string]string) {
		t.Helper()
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s image %q, want %q", k, got[k], w)
			}
		}
	}

	t.Run("tags", func(t *testing.T) {
		check(t, images(t, "--set", "kubeletPlugin.image.tag=v7"), map[string]string{
			"plugin":   "ghcr.io/tessera-dev/tessera-kubelet-plugin:v7",
			"mps":      "ghcr.io/tessera-dev/tessera-kubelet-plugin:v7",
			"webhook":  "ghcr.io/tessera-dev/tessera-webhook:v0.1.0", // the chart's appVersion
			"locality": "ghcr.io/tessera-dev/tessera-webhook:v0.1.0",
			"hami":     "example.com/hami:v2",
		})
	})
	t.Run("digests", func(t *testing.T) {
		got := images(t, "--set", strings.Join([]string{
			"kubeletPlugin.image.tag=v7", "kubeletPlugin.image.digest=" + pluginDigest,
			"webhook.image.tag=v7", "webhook.image.digest=" + webhookDigest,
			"kubeletPlugin.hamiCore.image.digest=" + hamiDigest,
		}, ","))
		check(t, got, map[string]string{
			"plugin":   "ghcr.io/tessera-dev/tessera-kubelet-plugin@" + pluginDigest,
			"mps":      "ghcr.io/tessera-dev/tessera-kubelet-plugin@" + pluginDigest,
			"webhook":  "ghcr.io/tessera-dev/tessera-webhook@" + webhookDigest,
			"locality": "ghcr.io/tessera-dev/tessera-webhook@" + webhookDigest,
			"hami":     "example.com/hami@" + hamiDigest,
		})
	})
	t.Run("MPS image of its own, by digest", func(t *testing.T) {
		got := images(t, "--set", "kubeletPlugin.mps.image.repository=example.com/mps,kubeletPlugin.mps.image.tag=v9,kubeletPlugin.mps.image.digest="+hamiDigest)
		check(t, got, map[string]string{"mps": "example.com/mps@" + hamiDigest})
	})

	// The MPS pod policy pins the daemon pods to the image the plugin is
	// told to use: by digest, that reference and no other.
	objs := objects(t, render(t, "--set", "kubeletPlugin.image.digest="+pluginDigest))
	v := compiledPolicy(t, find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "tessera-kubelet-plugin-mps-pods"))
	cfg, root := daemonConfig(t, find[appsv1.DaemonSet](t, objs, "DaemonSet", "tessera-kubelet-plugin"), "node-a")
	pod := cfg.Pod(isolation.NewMPS(root, nil).Daemon("GPU-0f5e6a2c-1111-2222-3333-444455556666", "team-a"))
	if denied := admit(t, v, admission.Create, pod, pluginUser("node-a")); denied != nil {
		t.Fatalf("the daemon pod of the digest-pinned image is refused: %v", denied)
	}
	pod.Spec.Containers[0].Image = "ghcr.io/tessera-dev/tessera-kubelet-plugin:v0.1.0"
	if denied := admit(t, v, admission.Create, pod, pluginUser("node-a")); denied == nil {
		t.Error("a daemon pod of the same repository by tag is admitted; want only the pinned digest")
	}
}

// TestImageDigestSchema: the schema takes only sha256:<64 lowercase hex>.
func TestImageDigestSchema(t *testing.T) {
	for _, set := range []string{
		"kubeletPlugin.image.digest=sha256:abc",
		"kubeletPlugin.image.digest=latest",
		"webhook.image.digest=sha256:" + strings.Repeat("A", 64),
		"webhook.image.digest=" + strings.TrimPrefix(pluginDigest, "sha256:"),
		"kubeletPlugin.mps.image.digest=md5:" + strings.Repeat("0", 32),
		"kubeletPlugin.hamiCore.image.digest=@" + pluginDigest,
	} {
		out, err := helm(t, "template", "tessera", chartDir, "--namespace", "tessera", "--kube-version", kubeVersion, "--set", set)
		if err == nil {
			t.Errorf("--set %s rendered; want the schema to refuse it", set)
			continue
		}
		if !strings.Contains(out, "digest") {
			t.Errorf("--set %s: message does not name the digest:\n%s", set, out)
		}
	}
}
