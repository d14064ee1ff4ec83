package publish

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// DynamicMIG names the GPUs published with dynamic MIG (--dynamic-mig):
// every GPU, or those named by NVML index or UUID. A named GPU that is not
// in MIG mode is published as usual and reported. The zero value names
// none: every MIG-mode GPU is static.
type DynamicMIG struct {
	All   bool
	Names []string
}

// ParseDynamicMIG reads --dynamic-mig: "all", or NVML indexes and GPU UUIDs
// ("0", "GPU-…").
func ParseDynamicMIG(values []string) (DynamicMIG, error) {
	var d DynamicMIG
	for _, v := range values {
		v = strings.TrimSpace(v)
		switch {
		case v == "":
		case strings.EqualFold(v, "all"):
			d.All = true
		case strings.HasPrefix(v, "GPU-"):
			d.Names = append(d.Names, v)
		default:
			if i, err := strconv.Atoi(v); err != nil || i < 0 || strconv.Itoa(i) != v {
				return DynamicMIG{}, fmt.Errorf("%q: want \"all\", an NVML index or a GPU UUID (GPU-…)", v)
			}
			d.Names = append(d.Names, v)
		}
	}
	if d.All && len(d.Names) > 0 {
		return DynamicMIG{}, fmt.Errorf("\"all\" and GPU names together: give one or the other")
	}
	return d, nil
}

// Named reports whether g is named (whatever its MIG mode).
func (d DynamicMIG) Named(g gpu.GPU) bool {
	return d.All || slices.Contains(d.Names, g.UUID) || slices.Contains(d.Names, strconv.Itoa(g.Index))
}

// Resolve returns the UUIDs of the GPUs published with dynamic MIG (named
// and in MIG mode), the named GPUs not in MIG mode, and the names that are
// no GPU of gpus.
func (d DynamicMIG) Resolve(gpus []gpu.GPU) (dynamic []string, notMIG []gpu.GPU, unknown []string) {
	for _, g := range gpus {
		switch {
		case !d.Named(g):
		case g.MIGEnabled:
			dynamic = append(dynamic, g.UUID)
		default:
			notMIG = append(notMIG, g)
		}
	}
	for _, n := range d.Names {
		if !slices.ContainsFunc(gpus, func(g gpu.GPU) bool { return g.UUID == n || strconv.Itoa(g.Index) == n }) {
			unknown = append(unknown, n)
		}
	}
	return dynamic, notMIG, unknown
}
