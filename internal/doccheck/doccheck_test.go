package doccheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// TestRepositoryLinks checks every relative link of every tracked Markdown
// file, CHANGELOG.md and the reports in results/ included.
func TestRepositoryLinks(t *testing.T) {
	root := repoRoot(t)
	repo, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	files, err := MarkdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	checked := 0
	for _, f := range files {
		checked++
		ps, err := repo.Check(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			problems = append(problems, p.String())
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d Markdown files, expected the repository's (README.md, docs/…)", checked)
	}
	if len(problems) > 0 {
		t.Errorf("%d broken links:\n%s", len(problems), strings.Join(problems, "\n"))
	}
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Resource model (verified on kube-apiserver/kube-scheduler v1.37.0)": "resource-model-verified-on-kube-apiserverkube-scheduler-v1370",
		"`tessera status`":                                            "tessera-status",
		"The NVIDIA_VISIBLE_DEVICES escape":                           "the-nvidia_visible_devices-escape",
		"Bounds that hold for every schedule: (f) and (f')":           "bounds-that-hold-for-every-schedule-f-and-f",
		"Opaque config: `gpu.tessera.dev/v1alpha1`, kind `GpuConfig`": "opaque-config-gputesseradevv1alpha1-kind-gpuconfig",
		"A [link](x.md) and **bold**":                                 "a-link-and-bold",
		"Fractions × models — naïve":                                  "fractions--models--naïve",
		"GPU and NIC under one <b>PCIe</b>":                           "gpu-and-nic-under-one-pcie",
	} {
		if got := Slug(heading); got != want {
			t.Errorf("Slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

func TestAnchors(t *testing.T) {
	md := "# Title\n\n## Usage\n\ntext\n\n## Usage\n\n```sh\n# not a heading\n```\n\n" +
		"Setext heading\n--------------\n\n| a | b |\n|---|---|\n\n<a id=\"custom\"></a>\n<a name='other'>x</a>\n" +
		"### Closed ###\n"
	got := Anchors(md)
	for _, want := range []string{"title", "usage", "usage-1", "setext-heading", "custom", "other", "closed"} {
		if !got[want] {
			t.Errorf("anchor %q missing; have %v", want, got)
		}
	}
	for _, not := range []string{"not-a-heading", "a--b", "usage-2"} {
		if got[not] {
			t.Errorf("anchor %q should not exist", not)
		}
	}
}

func TestLinks(t *testing.T) {
	md := "See [a](a.md) and ![img](i.png \"title\").\n" +
		"Not `[code](c.md)` nor ``[x](y.md)``.\n" +
		"```\n[fenced](f.md)\n```\n" +
		"  ```yaml\n  [indented fence](g.md)\n  ```\n" +
		"[anchor](#here) [angle](<b c.md>) [web](https://x.y/z.md)\n"
	var got []string
	for _, l := range Links(md) {
		got = append(got, l.Target)
	}
	want := []string{"a.md", "i.png", "#here", "b c.md", "https://x.y/z.md"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("Links = %q, want %q", got, want)
	}
	if ls := Links(md); ls[2].Line != 9 {
		t.Errorf("line of #here = %d, want 9", ls[2].Line)
	}
}

func TestCheck(t *testing.T) {
	root := t.TempDir()
	write := func(name, body string) {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Top\n[ok](docs/a.md#section-one) [dir](docs) [root](/docs/a.md)\n"+
		"[gone](docs/missing.md) [bad anchor](docs/a.md#nope) [self](#top) [self bad](#none)\n"+
		"[code anchor](main.go#L3) [web](https://example.com/x) [mail](mailto:a@b) [up](../x.md)\n")
	write("docs/a.md", "# A\n## Section one\n[back](../README.md#top)\n")
	write("main.go", "package main\n")
	repo, err := Open(root) // no git repository here: the walk lists the files
	if err != nil {
		t.Fatal(err)
	}
	ps, err := repo.Check("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	want := []string{
		"README.md:3: broken link docs/missing.md (no such file: docs/missing.md)",
		"README.md:3: broken link docs/a.md#nope (no anchor #nope in docs/a.md)",
		"README.md:3: broken link #none (no anchor #none in README.md)",
		"README.md:4: broken link ../x.md (outside the repository)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if ps, _ := repo.Check("docs/a.md"); len(ps) != 0 {
		t.Errorf("docs/a.md: %v", ps)
	}
}
