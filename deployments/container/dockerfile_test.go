// Package container holds Tessera's image build; this test keeps its base
// images pinned.
package container

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// pinned is a FROM line whose image is pinned by digest
// (image[:tag]@sha256:<64 hex>), optionally with a stage name.
var pinned = regexp.MustCompile(`^FROM\s+(--platform=\S+\s+)?[a-z0-9./_-]+(:[A-Za-z0-9._-]+)?@sha256:[a-f0-9]{64}(\s+AS\s+[a-z0-9-]+)?$`)

// TestBaseImagesArePinned: every base image of the Dockerfile is pinned by
// digest, so a rebuild of a commit gets the bytes it was built and tested
// with and a moved tag (or a registry that serves other bytes under it)
// cannot change the plugin's or the webhook's image. Stages built on an
// earlier stage (FROM build) need no digest; there are none today.
func TestBaseImagesArePinned(t *testing.T) {
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	froms := 0
	for i, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(strings.ToUpper(line), "FROM ") {
			continue
		}
		froms++
		if strings.Contains(line, "${") {
			t.Errorf("Dockerfile:%d: %q: a build argument in FROM can replace the pinned image", i+1, line)
		}
		if !pinned.MatchString(line) {
			t.Errorf("Dockerfile:%d: %q is not pinned by digest (image:tag@sha256:<64 hex>)", i+1, line)
		}
	}
	if froms != 3 {
		t.Errorf("%d FROM lines, want 3 (build, webhook, kubelet-plugin)", froms)
	}
}
