package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-dev/tessera/pkg/doctor"
)

// TestDoctorChecksTheRunningPluginsSettings: doctor reads the running
// plugin's command line from /proc and checks with its settings, and exits
// non-zero when a check fails.
func TestDoctorChecksTheRunningPluginsSettings(t *testing.T) {
	dir := t.TempDir()
	proc := filepath.Join(dir, "proc")
	registrar := filepath.Join(dir, "registry")
	if err := os.MkdirAll(filepath.Join(proc, "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(registrar, 0o755); err != nil {
		t.Fatal(err)
	}
	argv := []string{os.Args[0], "--node-name=node-a", "--mock-profile=hgx-h100", "--registrar-dir=" + registrar,
		"--plugin-data-dir=" + filepath.Join(dir, "data"), "--mps-image=example/plugin:v1", "--v=2"}
	if err := os.WriteFile(filepath.Join(proc, "1", "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := newCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"doctor", "-o", "json", "--proc-root", proc})
	err := cmd.Execute()
	var report doctor.Report
	if jerr := json.Unmarshal([]byte(out.String()[:strings.LastIndex(out.String(), "}")+1]), &report); jerr != nil {
		t.Fatalf("output is not a JSON report: %v\n%s", jerr, out.String())
	}
	if report.Node != "node-a" || !strings.Contains(report.Config, "running plugin, pid 1") {
		t.Errorf("report of node %q from %q, want node-a from the running plugin's flags", report.Node, report.Config)
	}
	byCheck := map[string]doctor.Result{}
	for _, r := range report.Results {
		byCheck[r.Check] = r
	}
	if r := byCheck["nvml"]; r.Status != doctor.OK || !strings.Contains(r.Message, "hgx-h100") {
		t.Errorf("nvml: %+v, want the mock profile's NVML", r)
	}
	if r := byCheck["mps-image"]; r.Status != doctor.OK || !strings.Contains(r.Message, "example/plugin:v1") {
		t.Errorf("mps-image: %+v", r)
	}
	// Nothing listens in the registrar dir: that check fails, and so does
	// the command.
	if r := byCheck["kubelet-registration"]; r.Status != doctor.Fail || !strings.Contains(r.Message, registrar) {
		t.Errorf("kubelet-registration: %+v", r)
	}
	if err == nil || !strings.Contains(err.Error(), "checks failed") {
		t.Errorf("doctor with a failed check returned %v, want an error (exit status 1)", err)
	}
}
