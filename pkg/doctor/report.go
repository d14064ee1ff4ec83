// Package doctor checks a node for what the gpu.tessera.dev kubelet plugin
// needs: NVML and the driver, the NVIDIA container toolkit's CDI spec,
// containerd's CDI setting, whether the NVIDIA runtime honours
// NVIDIA_VISIBLE_DEVICES from unprivileged containers, the plugin's kubelet
// sockets, what each isolation backend needs (MPS, HAMi-core,
// driver-enforced memory limits) and the clock against the API server's.
//
// Every check reads paths given in [Config] (as the checking process sees
// them: inside the plugin's pod, the chart's mounts) or goes through a small
// seam (opening NVML, the toolkit spec lookup, the API server's clock), so
// the checks run against a fake root directory in tests. A check never
// changes the node.
package doctor

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Status is the outcome of one check.
type Status string

const (
	// OK: what was checked is as Tessera needs it.
	OK Status = "OK"
	// Warn: works, but something an admin may want (a backend unavailable,
	// a setting that could not be read) is not as it should be.
	Warn Status = "WARN"
	// Fail: claims fail to prepare or containers run without their GPU or
	// limits until this is fixed.
	Fail Status = "FAIL"
	// Skip: the check does not apply here (a mock profile has no driver,
	// toolkit or container runtime of its own to check).
	Skip Status = "SKIP"
)

// Result is one check's line of the report.
type Result struct {
	// Check names what was checked ("nvml", "toolkit-cdi", ...).
	Check  string `json:"check"`
	Status Status `json:"status"`
	// Message says what was looked at and what was found.
	Message string `json:"message"`
	// Fix says what to do about a WARN or FAIL.
	Fix string `json:"fix,omitempty"`
}

// Report is the outcome of all checks on one node.
type Report struct {
	Node string `json:"node,omitempty"`
	// Config says where the checked configuration came from (the running
	// plugin's command line, or the defaults).
	Config  string   `json:"config,omitempty"`
	Results []Result `json:"results"`
}

// Count returns how many results have this status.
func (r Report) Count(s Status) int {
	n := 0
	for _, res := range r.Results {
		if res.Status == s {
			n++
		}
	}
	return n
}

// Err is nil unless a check failed; then it says how many, for the exit
// status of scripts.
func (r Report) Err() error {
	if n := r.Count(Fail); n > 0 {
		return fmt.Errorf("%d of %d checks failed", n, len(r.Results))
	}
	return nil
}

// WriteTable writes one line per check, the fix indented below a WARN or
// FAIL, and a summary line.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if r.Node != "" {
		fmt.Fprintf(tw, "Node %s", r.Node)
		if r.Config != "" {
			fmt.Fprintf(tw, " (%s)", r.Config)
		}
		fmt.Fprintln(tw)
	}
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", res.Status, res.Check, oneLine(res.Message))
		if res.Fix != "" {
			fmt.Fprintf(tw, "\t\tfix: %s\n", oneLine(res.Fix))
		}
	}
	fmt.Fprintf(tw, "%d OK, %d WARN, %d FAIL, %d SKIP\n", r.Count(OK), r.Count(Warn), r.Count(Fail), r.Count(Skip))
	return tw.Flush()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
