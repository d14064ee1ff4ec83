package toolkitconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFind: the first config that exists of the places is read, with the
// toolkit's defaults for what it does not set; none is ErrNotFound; a bad
// one is an error naming it.
func TestFind(t *testing.T) {
	root := t.TempDir()
	proc := t.TempDir()
	write := func(dir, rel, data string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := Find(Places("", root, proc)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no config anywhere: %v, want ErrNotFound", err)
	}

	// The GPU Operator's, seen through the host's init.
	write(filepath.Join(proc, "1/root"), Paths[1], "[nvidia-container-runtime]\nmode = \"cdi\"\n")
	f, err := Find(Places("", root, proc))
	if err != nil {
		t.Fatal(err)
	}
	if f.Host != "/"+Paths[1] || !f.Requests.Envvar || f.Requests.EnvvarSet || f.Requests.Mounts {
		t.Errorf("operator config with nothing set: %+v, want the defaults (envvar accepted, mounts not) at /%s", f, Paths[1])
	}

	// The host's own comes first.
	write(root, Paths[0], EnvvarSetting+" = false\n"+MountsSetting+" = true\n")
	f, err = Find(Places("", root, proc))
	if err != nil {
		t.Fatal(err)
	}
	if f.Host != "/"+Paths[0] || f.Requests != (DeviceRequests{Envvar: false, EnvvarSet: true, Mounts: true, MountsSet: true}) {
		t.Errorf("host config: %+v", f)
	}

	write(root, "bad.toml", EnvvarSetting+" = \"no\"\n")
	if _, err := Find(Places(filepath.Join(root, "bad.toml"), root, proc)); err == nil || !strings.Contains(err.Error(), "bad.toml") || !strings.Contains(err.Error(), "want true or false") {
		t.Errorf("a setting that is not a bool: %v", err)
	}
	write(root, "notoml", "[[[")
	if _, err := Find(Places(filepath.Join(root, "notoml"), root, proc)); err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "not a TOML file") {
		t.Errorf("not TOML: %v", err)
	}
}
