package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
)

// fillFlags are the fill experiment's flags.
type fillFlags struct {
	on                    bool
	trace, nodes, pods    string
	scale, target         float64
	nvlink                bool
	synthNodes, synthPods int
}

func registerFillFlags(fs *flag.FlagSet) *fillFlags {
	f := &fillFlags{}
	fs.BoolVar(&f.on, "fill", false, "run only the fill experiment (pods arrive shuffled and never leave; unallocated GPU capacity as the workload arrives) into fleet-fill.{md,png,json}")
	fs.StringVar(&f.trace, "fill-trace", "", "directory holding openb's openb_node_list_gpu_node.csv and openb_pod_list_default.csv (github.com/alibaba/clusterdata, cluster-trace-gpu-v2023/csv); empty: a synthetic trace")
	fs.StringVar(&f.nodes, "fill-nodes", "", "an openb node list (overrides -fill-trace's)")
	fs.StringVar(&f.pods, "fill-pods", "", "an openb pod list (overrides -fill-trace's)")
	fs.Float64Var(&f.scale, "fill-scale", 1, "keep this fraction of the nodes (every k-th in file order) to scale the fleet down; the workload follows the capacity")
	fs.Float64Var(&f.target, "fill-target", 1.3, "arrived GPU request to stop at, as a fraction of the fleet's GPUs")
	fs.BoolVar(&f.nvlink, "fill-nvlink", false, "give every multi-GPU pod an NVLink constraint (openb does not say)")
	fs.IntVar(&f.synthNodes, "fill-synthetic-nodes", 60, "nodes of the synthetic trace")
	fs.IntVar(&f.synthPods, "fill-synthetic-pods", 1500, "pods of the synthetic trace")
	return f
}

// load reads the fleet and pods, from the trace or the synthetic generator,
// and says where they came from.
func (f *fillFlags) load(seed int64) (fleet.Fleet, []fleet.Job, string, error) {
	nodesPath, podsPath := f.nodes, f.pods
	if f.trace != "" {
		if nodesPath == "" {
			nodesPath = filepath.Join(f.trace, "openb_node_list_gpu_node.csv")
		}
		if podsPath == "" {
			podsPath = filepath.Join(f.trace, "openb_pod_list_default.csv")
		}
	}
	var nodesData, podsData []byte
	var source string
	switch {
	case nodesPath != "" && podsPath != "":
		var err error
		if nodesData, err = os.ReadFile(nodesPath); err != nil {
			return fleet.Fleet{}, nil, "", fmt.Errorf("-fill-nodes: %w", err)
		}
		if podsData, err = os.ReadFile(podsPath); err != nil {
			return fleet.Fleet{}, nil, "", fmt.Errorf("-fill-pods: %w", err)
		}
		source = fmt.Sprintf("openb-format files %s and %s (Alibaba cluster-trace-gpu-v2023 when these are the trace's)", filepath.Base(nodesPath), filepath.Base(podsPath))
	case nodesPath == "" && podsPath == "":
		var nb, pb bytes.Buffer
		if err := fleet.SyntheticOpenB(&nb, &pb, f.synthNodes, f.synthPods, seed); err != nil {
			return fleet.Fleet{}, nil, "", err
		}
		nodesData, podsData = nb.Bytes(), pb.Bytes()
		source = fmt.Sprintf("a synthetic trace in the openb format (fleet.SyntheticOpenB, %d nodes, %d pods, seed %d): made up, shaped like openb, not measured; run with -fill-trace for the real trace", f.synthNodes, f.synthPods, seed)
	default:
		return fleet.Fleet{}, nil, "", fmt.Errorf("-fill-nodes and -fill-pods go together")
	}
	fl, err := fleet.ReadOpenBNodes(bytes.NewReader(nodesData))
	if err != nil {
		return fleet.Fleet{}, nil, "", err
	}
	pods, err := fleet.ReadOpenBPods(bytes.NewReader(podsData), fleet.OpenBOptions{NVLink: f.nvlink})
	if err != nil {
		return fleet.Fleet{}, nil, "", err
	}
	return fl, pods, source, nil
}

// scaled keeps every k-th node of f for -fill-scale.
func scaled(f fleet.Fleet, fraction float64) (fleet.Fleet, string, error) {
	if !(fraction > 0 && fraction <= 1) {
		return f, "", fmt.Errorf("-fill-scale %g: want a fraction in (0, 1]", fraction)
	}
	if fraction == 1 {
		return f, "", nil
	}
	k := int(math.Round(1 / fraction))
	var out fleet.Fleet
	for i, s := range f.Nodes {
		if i%k == 0 {
			out.Nodes = append(out.Nodes, s)
		}
	}
	return out, fmt.Sprintf("Scaled down: every %d-th node of the %d in the node list (%d GPUs of %d), the workload scaled with the capacity.", k, len(f.Nodes), out.GPUs(), f.GPUs()), nil
}

func (f *fillFlags) run(seed int64, parallel int, out, command string) error {
	fl, pods, source, err := f.load(seed)
	if err != nil {
		return err
	}
	fl, note, err := scaled(fl, f.scale)
	if err != nil {
		return err
	}
	if f.nvlink {
		note += " Multi-GPU pods ask for NVLink (-fill-nvlink)."
	}
	cfg := fleet.FillConfig{Command: command, Source: source, Fleet: fl, Pods: pods, Seed: seed, Target: f.target, Parallel: parallel, Note: note}
	rep, err := fleet.Fill(context.Background(), cfg)
	if err != nil {
		return err
	}
	var png bytes.Buffer
	if err := rep.WritePNG(&png); err != nil {
		return err
	}
	js, err := jsonFile("fleet-fill.json", struct {
		Command  string
		Source   string
		Fleet    string
		GPUs     int
		Sequence int
		Points   []float64
		Results  []fleet.FillResult
	}{command, source, fl.String(), fl.GPUs(), rep.Sequence, fleet.FillPoints, rep.Results})
	if err != nil {
		return err
	}
	if err := writeFiles(out, outFile{"fleet-fill.md", []byte(rep.Markdown())}, outFile{"fleet-fill.png", png.Bytes()}, js); err != nil {
		return err
	}
	fmt.Printf("wrote %s (fleet-fill.{md,png,json}; %d pods on %d GPUs, %.1fs)\n", out, rep.Sequence, fl.GPUs(), rep.Wall.Seconds())
	return nil
}
