package model

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite deployments/deviceclasses.yaml from DeviceClasses()")

// deviceClassesFile is the manifest admins apply (and the chart copies).
var deviceClassesFile = filepath.Join("..", "..", "deployments", "deviceclasses.yaml")

// DeviceClassesYAML is what deployments/deviceclasses.yaml must hold: the
// DeviceClasses as a multi-document YAML stream.
func deviceClassesYAML(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("# Generated from pkg/model.DeviceClasses(); regenerate with: go test ./pkg/model -run TestDeviceClassesFile -update\n")
	for _, c := range DeviceClasses() {
		b, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal DeviceClass %s: %v", c.Name, err)
		}
		buf.WriteString("---\n")
		buf.Write(b)
	}
	return buf.Bytes()
}

// TestDeviceClassesFile keeps deployments/deviceclasses.yaml equal to DeviceClasses().
func TestDeviceClassesFile(t *testing.T) {
	want := deviceClassesYAML(t)
	if *update {
		if err := os.WriteFile(deviceClassesFile, want, 0o644); err != nil {
			t.Fatalf("update %s: %v", deviceClassesFile, err)
		}
	}
	got, err := os.ReadFile(deviceClassesFile)
	if err != nil {
		t.Fatalf("read %s: %v (regenerate with go test ./pkg/model -run TestDeviceClassesFile -update)", deviceClassesFile, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not what DeviceClasses() marshals; regenerate with go test ./pkg/model -run TestDeviceClassesFile -update\n--- want\n%s--- got\n%s", deviceClassesFile, want, got)
	}
}

func TestDeviceClasses(t *testing.T) {
	classes := DeviceClasses()
	if len(classes) != 4 {
		t.Fatalf("%d classes, want 4", len(classes))
	}
	whole, shared, lent, mig := classes[0], classes[1], classes[2], classes[3]
	if mig.Name != "mig.gpu.tessera.dev" || mig.Spec.Selectors[0].CEL.Expression != `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "mig"` ||
		mig.Spec.ExtendedResourceName != nil {
		t.Errorf("mig class %+v", mig)
	}
	if lent.Name != "lent.gpu.tessera.dev" || lent.Spec.Selectors[0].CEL.Expression != `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "lent"` ||
		lent.Spec.ExtendedResourceName != nil {
		t.Errorf("lent class %+v", lent)
	}
	if whole.Name != "gpu.tessera.dev" || shared.Name != "shared.gpu.tessera.dev" {
		t.Errorf("class names %q, %q", whole.Name, shared.Name)
	}
	if got := whole.Spec.Selectors[0].CEL.Expression; got != `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu"` {
		t.Errorf("whole selector %s", got)
	}
	if got := shared.Spec.Selectors[0].CEL.Expression; got != `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "shared"` {
		t.Errorf("shared selector %s", got)
	}
	if whole.Spec.ExtendedResourceName == nil || *whole.Spec.ExtendedResourceName != "tessera.dev/gpu" {
		t.Errorf("whole extendedResourceName %v, want tessera.dev/gpu", whole.Spec.ExtendedResourceName)
	}
	if shared.Spec.ExtendedResourceName != nil {
		t.Errorf("shared class has extendedResourceName %q; shares need capacity requests, which an extended resource cannot carry", *shared.Spec.ExtendedResourceName)
	}
	// Each call returns fresh objects.
	classes[0].Name = "changed"
	if DeviceClasses()[0].Name == "changed" {
		t.Errorf("DeviceClasses returns shared objects")
	}
}
