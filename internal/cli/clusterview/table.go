package clusterview

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// WriteTable writes the report as a table: one row per GPU (the first holder
// on it), one more row per further holder. MEMORY and CORES are "held by
// claims / total".
//
//	NODE    GPU    MODEL                  MEMORY         CORES    HEALTH   HOLDERS
//	node-1  gpu-0  NVIDIA H100 80GB HBM3  57Gi/79.6Gi    75/100   Healthy  demo/quarter-0 (claim quarter-0-gpu-x7k2p: 19Gi, 25 cores)
//	                                                                       demo/quarter-1 (claim quarter-1-gpu-9fj3d: 19Gi, 25 cores)
//	node-1  gpu-7  NVIDIA H100 80GB HBM3  79.6Gi/79.6Gi  100/100  Healthy  demo/notebook (claim notebook: whole GPU)
//	                                                                       lent 68.6Gi to: demo/batch (claim batch-gpu-2kq8x: 20Gi, 0 cores; MPS enforces …)
//
// A GPU in MIG mode has one row per MIG device: every instance of a static
// GPU (held or free), the held placements of a dynamic one:
//
//	node-1  gpu-0  NVIDIA H100 80GB HBM3  39.5Gi/79Gi  57/99  Healthy  MIG gpu-0-mig-1: demo/a (claim a: MIG 4g.40gb)
//	                                                                   MIG gpu-0-mig-2 (3g.40gb): free
//
// A GPU whose lending device is not lent shows "not lent (OwnerBusy)" and
// its borrowers still being evicted, if any.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGPU\tMODEL\tMEMORY\tCORES\tHEALTH\tHOLDERS")
	for _, n := range r.Nodes {
		for _, g := range n.GPUs {
			holders := []string{"-"}
			switch {
			case g.MIG != nil:
				holders = g.MIG.lines()
			case len(g.Holders) > 0:
				holders = holders[:0]
				for _, h := range g.Holders {
					holders = append(holders, h.String())
				}
			}
			holders = append(holders, g.Lending.lines()...)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s\t%d/%d\t%s\t%s\n", n.Name, g.Device, orDash(g.ProductName),
				Bytes(g.AllocatedMemoryBytes), Bytes(g.MemoryBytes), g.AllocatedCores, g.Cores, g.health(), holders[0])
			for _, h := range holders[1:] {
				fmt.Fprintf(tw, "\t\t\t\t\t\t%s\n", h)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Budgets) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	return writeBudgets(w, r.Budgets)
}

// lines are the table rows of a GPU's lending: nothing for a GPU that is
// neither lent nor lending to anyone.
func (l *Lending) lines() []string {
	if l == nil || (l.Phase != "Lent" && len(l.Borrowers) == 0) {
		return nil
	}
	head := "lent " + Bytes(l.LendableBytes)
	switch l.Phase {
	case "Lent":
	case "NotLent":
		head = "not lent"
	default:
		head = "not lent (" + l.Phase + ")"
	}
	if len(l.Borrowers) == 0 {
		return []string{head + ", no borrower"}
	}
	var out []string
	for i, b := range l.Borrowers {
		prefix := strings.Repeat(" ", len(head)+4)
		if i == 0 {
			prefix = head + " to: "
		}
		out = append(out, prefix+b.String())
	}
	return out
}

// health is "Healthy", "Unhealthy(XID-79:NoExecute)" for Tessera's health
// taint (value and effect), or "Tainted(key=value:Effect)" for others.
func (g GPU) health() string {
	if g.Healthy && len(g.Taints) == 0 {
		return "Healthy"
	}
	var taints []string
	for _, t := range g.Taints {
		s := t.Value + ":" + string(t.Effect)
		if t.Key != unhealthyTaint {
			s = t.Key + "=" + s
		}
		taints = append(taints, s)
	}
	state := "Tainted"
	if !g.Healthy {
		state = "Unhealthy"
	}
	return state + "(" + strings.Join(taints, ",") + ")"
}

// String is how a holder appears in the table: the pods, the claim, what
// it holds and, for a share, what enforces its limits on the node:
//
//	ns/pod (claim c: 19Gi, 25 cores; MPS enforces memory 19Gi and compute 25%)
//	ns/pod (claim c: 19Gi, 25 cores; Advisory, not enforced: memory 19Gi and compute 25%)
//	ns/pod (claim c: 8Gi, 10 cores; not prepared: isolation HAMiCore: library …)
//	ns/pod (claim c: 8Gi, 10 cores; not attested)
//	ns/pod (claim c: whole GPU)
func (h Holder) String() string {
	pods := "<no pod>"
	if len(h.Pods) > 0 {
		pods = strings.Join(h.Pods, ",")
	}
	what := "whole GPU"
	if h.MIGProfile != "" {
		what = "MIG " + h.MIGProfile
	}
	switch {
	case h.AdminAccess:
		what = "admin access"
	case h.ShareID != "":
		what = Bytes(h.MemoryBytes) + ", " + strconv.FormatInt(h.Cores, 10) + " cores"
		switch {
		case h.PrepareError != "":
			what += "; not prepared: " + shorten(h.PrepareError, maxErrorInTable)
		case h.Attestation != nil:
			what += "; " + h.Attestation.Limits()
		default:
			// Not prepared yet, or the plugin's status write failed:
			// nothing vouches for the limits.
			what += "; not attested"
		}
	case h.PrepareError != "":
		what += "; not prepared: " + shorten(h.PrepareError, maxErrorInTable)
	}
	return fmt.Sprintf("%s/%s (claim %s: %s)", h.Namespace, pods, h.Claim, what)
}

// Bytes formats a byte count in binary units with at most one decimal:
// 0, 512Mi, 19Gi, 79.6Gi.
func Bytes(b int64) string {
	if b == 0 {
		return "0"
	}
	units := []string{"", "Ki", "Mi", "Gi", "Ti", "Pi"}
	v := float64(b)
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + units[i]
}

// maxErrorInTable is how much of a prepare error the table shows; -o json
// and -o yaml carry all of it.
const maxErrorInTable = 120

// shorten cuts s to at most n bytes (on a rune boundary), marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// lines are the table rows of a GPU in MIG mode: one per MIG device with its
// holders, or that it is free; a dynamic GPU without held placements says so.
func (m *MIG) lines() []string {
	var out []string
	for _, d := range m.Devices {
		head := "MIG " + d.Device
		if d.Unhealthy != "" {
			head += " (unhealthy " + d.Unhealthy + ")"
		}
		if len(d.Holders) == 0 {
			what := orDash(d.Profile)
			if d.Unhealthy != "" {
				what += ", unhealthy " + d.Unhealthy
			}
			out = append(out, fmt.Sprintf("MIG %s (%s): free", d.Device, what))
			continue
		}
		for i, h := range d.Holders {
			prefix := strings.Repeat(" ", len(head)+2)
			if i == 0 {
				prefix = head + ": "
			}
			out = append(out, prefix+h.String())
		}
	}
	if len(out) == 0 {
		what := "MIG: no instance"
		if m.Dynamic {
			what = "MIG (dynamic): no placement held"
		}
		out = append(out, what)
	}
	return out
}
