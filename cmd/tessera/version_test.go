package main

import (
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The -X flags of make build win over the build info.
func TestVersionFromLdflags(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "v0.4.0", "0123456789abcdef"
	bi := &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "ffff"}}}
	if got, want := versionOf(bi, true).String(), "tessera v0.4.0, commit 0123456789abcdef, go1.26.1"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// Without -X flags, the commit comes from the build info Go records.
func TestVersionFromBuildInfo(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "", ""
	bi := &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := versionOf(bi, true).String(), "tessera dev, commit abc123 (modified), go1.26.1"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	bi = &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v0.3.1"}}
	if got, want := versionOf(bi, true).String(), "tessera v0.3.1, commit unknown, go1.26.1"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := versionOf(nil, false); got.Version != "dev" || got.Commit != "unknown" || got.GoVersion == "" {
		t.Errorf("no build info: %+v", got)
	}
}

// tessera --version and tessera version print the same line; -o json the
// same facts.
func TestVersionCommand(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "v9.9.9", "cafe"
	flag, _, err := run(t, "--version")
	if err != nil {
		t.Fatal(err)
	}
	sub, _, err := run(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(flag, "tessera v9.9.9, commit cafe, go") || flag != sub {
		t.Errorf("--version %q, version %q", flag, sub)
	}
	out, _, err := run(t, "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v versionInfo
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Version != "v9.9.9" || v.Commit != "cafe" {
		t.Errorf("version -o json: %q (%v)", out, err)
	}
	if _, _, err := run(t, "version", "-o", "xml"); err == nil || !strings.Contains(err.Error(), `--output "xml"`) {
		t.Errorf("version -o xml: %v", err)
	}
}

// Every command reads as kubectl's do: a usage line, a one-line summary, a
// description and examples.
func TestHelpText(t *testing.T) {
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() == "help" || c.Name() == "completion" || c.Parent() != nil && c.Parent().Name() == "completion" {
			return
		}
		if c.Use == "" || c.Short == "" || c.Long == "" || c.Example == "" {
			t.Errorf("command %q: Use %q, Short %q, Long set %v, Example set %v", c.CommandPath(), c.Use, c.Short, c.Long != "", c.Example != "")
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	root := newRootCommand()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	walk(root)

	out, _, err := run(t, "why", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Usage:\n  tessera why (POD | pod/NAME | claim/NAME)", "Examples:\n  # Why is pod", "-n, --namespace", "-o, --output", "--kubeconfig"} {
		if !strings.Contains(out, want) {
			t.Errorf("why --help: want %q in\n%s", want, out)
		}
	}
}

// Bad input gets an error that names the argument or flag.
func TestWhyErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"why"}, "accepts 1 arg(s), received 0"},
		{[]string{"why", "a", "b"}, "accepts 1 arg(s), received 2"},
		{[]string{"why", "p", "-o", "wide"}, `--output "wide": unknown format (valid: table, json, yaml)`},
		{[]string{"why", "p", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubeconfig"},
		{[]string{"status", "-o", "wide"}, `--output "wide"`},
	} {
		_, _, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
