package main

import (
	"bytes"
	"strings"
	"testing"
)

func runRoot(t *testing.T, argv0 string, args ...string) (string, error) {
	t.Helper()
	root := newRootCommand()
	asKubectlPlugin(root, argv0)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestKubectlPluginName(t *testing.T) {
	out, err := runRoot(t, "/usr/local/bin/kubectl-tessera", "doctor", "--help")
	if err != nil || !strings.Contains(out, "kubectl tessera doctor [NODE]") {
		t.Errorf("as kubectl-tessera: %v\n%s", err, out)
	}
	out, err = runRoot(t, "/usr/local/bin/tessera", "doctor", "--help")
	if err != nil || !strings.Contains(out, "  tessera doctor [NODE]") {
		t.Errorf("as tessera: %v\n%s", err, out)
	}
}

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_tessera", "zsh": "#compdef tessera", "fish": "complete -c tessera"} {
		out, err := runRoot(t, "tessera", "completion", shell)
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("completion %s: %v; want %q in\n%.300s", shell, err, want, out)
		}
	}
	// What the completion scripts ask the binary: subcommands, and nodes
	// are free text.
	out, err := runRoot(t, "kubectl-tessera", "__complete", "do")
	if err != nil || !strings.Contains(out, "doctor") {
		t.Errorf("__complete do: %v\n%s", err, out)
	}
}

func TestDoctorRejectsUnknownOutput(t *testing.T) {
	_, err := runRoot(t, "tessera", "doctor", "node-a", "-o", "wide")
	if err == nil || !strings.Contains(err.Error(), `--output "wide"`) {
		t.Errorf("doctor -o wide: %v", err)
	}
}
