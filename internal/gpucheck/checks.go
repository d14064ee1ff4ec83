package gpucheck

import (
	"fmt"
	"regexp"
	"strings"
)

// A check's outcome. The check as a whole is complete only when every check
// ended in one of them with its detail said: a skip without a reason, or a
// check that never reported, is a defect of the check itself, and the exit
// status says so.
const (
	// StatusMeasured: a figure was taken on this machine's GPU (or read
	// from its driver) and judged; Detail holds the verdict.
	StatusMeasured = "measured"
	// StatusSimulated: the mock mode ran the step end to end, figures
	// from a simulated probe or a mock driver; never what a GPU does.
	StatusSimulated = "simulated (mock)"
	// StatusSkipped: the machine cannot do it (no MPS, not root, no
	// HAMi-core source); Detail says why.
	StatusSkipped = "skipped"
	// StatusMismatch: measured, and the figure missed its target or
	// disagreed with the ground truth.
	StatusMismatch = "MISMATCH"
	// StatusError: the step failed.
	StatusError = "ERROR"
)

// Check is one thing the check proves (or says it could not).
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

// verdict sets a measured check from its mismatches.
func (c *Check) verdict(mismatches []string, ok string) {
	if len(mismatches) == 0 {
		c.Status, c.Detail = StatusMeasured, ok
		return
	}
	c.Status, c.Detail = StatusMismatch, strings.Join(mismatches, "; ")
}

// Complete reports whether every check ended with a stated outcome: measured
// (or, in a mock run, simulated), or skipped with a reason. Anything else (a
// mismatch, an error, no outcome, or a check the check does not do) is
// incomplete. It returns the checks that were.
func Complete(checks []Check, mock bool) (bool, []string) {
	var bad []string
	for _, c := range checks {
		switch c.Status {
		case StatusMeasured:
			if mock {
				bad = append(bad, c.Name+": measured in a mock run")
			}
		case StatusSimulated:
			if !mock {
				bad = append(bad, c.Name+": simulated in a run on a GPU")
			}
		case StatusSkipped:
			if strings.TrimSpace(c.Detail) == "" {
				bad = append(bad, c.Name+": "+c.Status+" without a reason")
			}
		case StatusMismatch, StatusError:
			bad = append(bad, c.Name+": "+c.Status)
		default:
			bad = append(bad, fmt.Sprintf("%s: no outcome (%q)", c.Name, c.Status))
		}
	}
	return len(bad) == 0, bad
}

var poolNameInvalid = regexp.MustCompile(`[^a-z0-9.-]+`)

// DefaultPoolName is the node name when the hostname makes no valid one.
const DefaultPoolName = "gpu-check-node"

// PoolName turns a hostname into a valid pool (node) name, a DNS subdomain:
// lower case, runs of anything but [a-z0-9.-] become "-", every label
// starts and ends alphanumeric, at most 253 characters. A hostname with
// nothing left ("", "_", a container's odd name) gives DefaultPoolName.
func PoolName(host string) string {
	s := poolNameInvalid.ReplaceAllString(strings.ToLower(host), "-")
	var labels []string
	for l := range strings.SplitSeq(s, ".") {
		l = strings.Trim(l, "-")
		if len(l) > 63 {
			l = strings.Trim(l[:63], "-")
		}
		if l != "" {
			labels = append(labels, l)
		}
	}
	s = strings.Join(labels, ".")
	if len(s) > 253 {
		s = strings.Trim(s[:253], ".-")
	}
	if s == "" {
		return DefaultPoolName
	}
	return s
}
