package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/internal/cli/why"
)

func newWhyCommand() *cobra.Command {
	var (
		flags     clusterReportFlags
		namespace string
	)
	cmd := &cobra.Command{
		Use:   "why (POD | pod/NAME | claim/NAME) [-n NAMESPACE] [-o table|json|yaml]",
		Short: "Explain why a pod's or claim's GPUs cannot be allocated, node by node",
		Long: `Explain why a pending pod (or a ResourceClaim) gets no GPU.

tessera why runs kube-scheduler's own DRA allocator, with the feature set of the
1.37 scheduler, over the live ResourceSlices, DeviceClasses and allocated
ResourceClaims, once per node that publishes gpu.tessera.dev devices. Where the
allocator refuses, it says per GPU what fails: memory or cores short by how much
and which claims hold them, the whole GPU blocked by shares, a device taint
(unhealthy, not lent, or added by a DeviceTaintRule such as a locality fence,
named by the rule), a CEL selector that is false, too few GPUs in one NVLink
domain. For a MIG request it names the memory slices, compute slices and engines
a placement needs and which claims hold them. Each node ends with what would fit
there now (the largest share, free whole GPUs, free MIG profiles).

A pod's claims are its spec.resourceClaims (a template's claim as the pod's
status names it) and, for tessera.dev/gpu in its containers' resources, the
claim the scheduler creates for extended resources.

Needs get on pods and resourceclaims, list on resourceslices, deviceclasses
and resourceclaims in all namespaces, and (optionally) list on nodes and
devicetaintrules; without the latter a note says the rules' taints are not
considered.`,
		Example: `  # Why is pod train-0 in namespace ml pending?
  tessera why train-0 -n ml

  # The same for a ResourceClaim, as JSON
  tessera why claim/train-0-gpu -n ml -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runClusterReport(cmd, &flags, func(ctx context.Context, client kubernetes.Interface, ns string) (why.Report, error) {
				if namespace != "" {
					ns = namespace
				}
				return why.Get(ctx, client, ns, args[0])
			})
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of the pod or claim (default: the kubeconfig context's)")
	flags.add(cmd)
	return cmd
}

// formatTable is the human output of the commands that read the cluster.
const formatTable = "table"

// checkReportFormat rejects an unknown -o of a command that writes a report.
func checkReportFormat(format string) error {
	switch format {
	case formatTable, formatJSON, formatYAML:
		return nil
	}
	return fmt.Errorf("--output %q: unknown format (valid: table, json, yaml)", format)
}

// writeReport writes v as JSON or YAML, or with table for the table format.
func writeReport(w io.Writer, format string, v any, table func(io.Writer) error) error {
	switch format {
	case formatJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case formatYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case formatTable:
		return table(w)
	}
	return checkReportFormat(format)
}

// clusterReportFlags are the flags of a command that reads the cluster and
// writes a report: kubectl's and -o.
type clusterReportFlags struct {
	kube   kubeFlags
	output string
}

func (f *clusterReportFlags) add(cmd *cobra.Command) {
	f.kube.add(cmd)
	cmd.Flags().StringVarP(&f.output, "output", "o", formatTable, "output format: table, json or yaml")
}

// tableReport is a report that writes itself as a table too.
type tableReport interface {
	WriteTable(w io.Writer) error
}

// runClusterReport checks -o, connects to the cluster, reads the report with
// get (namespace: the kubeconfig context's) and writes it.
func runClusterReport[R tableReport](cmd *cobra.Command, f *clusterReportFlags, get func(ctx context.Context, client kubernetes.Interface, namespace string) (R, error)) error {
	if err := checkReportFormat(f.output); err != nil {
		return err
	}
	client, ns, err := f.kube.client()
	if err != nil {
		return err
	}
	report, err := get(cmd.Context(), client, ns)
	if err != nil {
		return err
	}
	return writeReport(cmd.OutOrStdout(), f.output, report, report.WriteTable)
}
