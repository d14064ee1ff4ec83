package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// Output formats of -o.
const (
	formatYAML = "yaml"
	formatJSON = "json"
)

var formats = []string{formatYAML, formatJSON}

// addOutputFlag adds -o/--output to cmd, stored in *format.
func addOutputFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVarP(format, "output", "o", formatYAML, "output format: "+strings.Join(formats, " or "))
}

// writeObjects writes Kubernetes objects (apiVersion and kind set) to w: as a
// multi-document YAML stream ("---" before each object) for yaml, which
// kubectl apply -f takes as it is; as an indented v1 List for json.
func writeObjects[T any](w io.Writer, format string, objs []T) error {
	switch format {
	case formatYAML:
		for i := range objs {
			b, err := yaml.Marshal(objs[i])
			if err != nil {
				return fmt.Errorf("encode object %d as YAML: %w", i, err)
			}
			if _, err := fmt.Fprintf(w, "---\n%s", b); err != nil {
				return err
			}
		}
		return nil
	case formatJSON:
		list := struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Items      []T    `json:"items"`
		}{APIVersion: "v1", Kind: "List", Items: objs}
		if list.Items == nil {
			list.Items = []T{}
		}
		b, err := json.MarshalIndent(list, "", "  ")
		if err != nil {
			return fmt.Errorf("encode objects as JSON: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	default:
		return checkFormat(format)
	}
}

// checkFormat rejects an unknown -o before any work is done.
func checkFormat(format string) error {
	for _, f := range formats {
		if format == f {
			return nil
		}
	}
	return fmt.Errorf("--output %q: unknown format (valid: %s)", format, strings.Join(formats, ", "))
}
