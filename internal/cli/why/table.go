package why

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes the report for people: the target and its claims, then
// per node the verdict, what fails on which GPU, and what would fit now.
func (r Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", r.Target)
	for _, c := range r.Claims {
		name := "claim " + c.Namespace + "/" + c.Name
		switch {
		case c.Generated:
			name += " (to be created by the scheduler)"
		case c.AllocatedOn != "":
			name += " (allocated on " + c.AllocatedOn + ")"
		}
		fmt.Fprintf(&b, "  %s\n", name)
		for _, req := range c.Requests {
			fmt.Fprintf(&b, "    %s\n", req)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	if len(r.Nodes) == 0 && len(r.Notes) == 0 {
		fmt.Fprintf(&b, "  no node publishes gpu.tessera.dev devices\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if len(r.Nodes) == 0 {
		return nil
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGPU\tWHY")
	for _, n := range r.Nodes {
		if n.Fits {
			fmt.Fprintf(tw, "%s\t-\tfits: %s (if the pod is pending, the reason is not its devices: see kubectl describe pod)\n", n.Name, strings.Join(n.Allocation, ", "))
		}
		for _, why := range n.Reasons {
			fmt.Fprintf(tw, "%s\t-\t%s\n", n.Name, why)
		}
		for _, g := range n.GPUs {
			for _, why := range g.Reasons {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Name, g.Name, why)
			}
		}
		fmt.Fprintf(tw, "%s\t-\tfits now: %s\n", n.Name, n.FitsNow)
	}
	return tw.Flush()
}

func (f FitsNow) String() string {
	share := "no share"
	if s := f.LargestShare; s != nil {
		share = fmt.Sprintf("a share of up to %s and %d cores (%s)", bytes(s.MemoryBytes), s.Cores, s.GPU)
	}
	s := fmt.Sprintf("%s; %d whole GPU(s)", share, f.WholeGPUs)
	for _, m := range f.MIG {
		s += fmt.Sprintf("; MIG on %s: %s", m.GPU, strings.Join(m.Profiles, ", "))
	}
	return s
}
