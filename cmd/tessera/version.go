package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Set at build time (make build):
//
//	go build -ldflags "-X main.version=v0.4.0 -X main.commit=$(git rev-parse HEAD)"
//
// When empty, versionOf falls back to what the Go toolchain records in the
// binary (the module version, the VCS revision of the checkout it built).
var (
	version string
	commit  string
)

// versionInfo is what `tessera version` prints.
type versionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"goVersion"`
}

// versionOf is the version from the -X flags, completed from the build info
// (ok false: none, as in `go run` without VCS or a test binary).
func versionOf(bi *debug.BuildInfo, ok bool) versionInfo {
	v := versionInfo{Version: version, Commit: commit, GoVersion: runtime.Version()}
	if !ok || bi == nil {
		bi = &debug.BuildInfo{}
	}
	if bi.GoVersion != "" {
		v.GoVersion = bi.GoVersion
	}
	if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.Version = bi.Main.Version
	}
	if v.Commit == "" {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Version == "" {
		v.Version = "dev"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	return v
}

func currentVersion() versionInfo { return versionOf(debug.ReadBuildInfo()) }

func (v versionInfo) String() string {
	commit := v.Commit
	if v.Modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("tessera %s, commit %s, %s", v.Version, commit, v.GoVersion)
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version [-o table|json|yaml]",
		Short: "Print the version and git commit of this tessera binary",
		Long: `Print the version and git commit tessera was built from, and its Go version.
make build sets them; a plain go build records the commit of the checkout.`,
		Example: `  tessera version
  tessera --version
  tessera version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkReportFormat(output); err != nil {
				return err
			}
			v := currentVersion()
			return writeReport(cmd.OutOrStdout(), output, v, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, v)
				return err
			})
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", formatTable, "output format: table (one line), json or yaml")
	return cmd
}
