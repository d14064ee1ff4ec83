// Package layout holds tests of the repository's layout: what the kubelet
// plugin and webhook images build (api/, pkg/ and their two commands, the only
// folders deployments/container/Dockerfile copies besides cmd/) imports nothing
// from internal/, where the lab (internal/bench, internal/gpucheck) and the
// CLI's own packages (internal/cli) live, and the two binaries link none of
// the test fixtures kept in pkg/.
package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/tessera-dev/tessera"

// shipped are the package patterns the images are built from.
var shipped = []string{"./api/...", "./pkg/...", "./cmd/tessera-kubelet-plugin", "./cmd/tessera-webhook"}

func TestShippedCodeImportsNoInternalPackage(t *testing.T) {
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}, shipped...)
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	var bad []string
	packages := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], module+"/") {
			continue
		}
		packages++
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, module+"/internal/") {
				bad = append(bad, fields[0]+" imports "+imp)
			}
		}
	}
	if packages < 10 {
		t.Fatalf("go list found only %d of the module's packages behind %v: the patterns are wrong", packages, shipped)
	}
	for _, b := range bad {
		t.Errorf("%s: the images are built from api/, pkg/ and cmd/ only (deployments/container/Dockerfile)", b)
	}
}

// The test fixtures in pkg/ (gputest, publishtest, ...) import testing and
// are for tests only: neither image binary may link a package that imports
// testing.
func TestImagesLinkNoTestFixture(t *testing.T) {
	args := []string{"list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./cmd/tessera-kubelet-plugin", "./cmd/tessera-webhook"}
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	packages := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if fields[0] == "testing" {
			t.Errorf("an image binary links the testing package")
		}
		if !strings.HasPrefix(fields[0], module+"/") {
			continue
		}
		packages++
		if slices.Contains(fields[1:], "testing") {
			t.Errorf("an image binary links %s, which imports testing", fields[0])
		}
	}
	if packages < 10 {
		t.Fatalf("go list found only %d of the module's packages behind the image commands", packages)
	}
}
