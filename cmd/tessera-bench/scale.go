package main

// "tessera-bench scale" measures the real kube-scheduler placing Tessera claims
// on the kwok cluster of hack/scale/cluster.sh (internal/bench/scale; docs/scale.md):
//
//	tessera-bench scale -kubeconfig K -nodes 100,500,1000 -out results   # results/scale.{md,png,json}
//	tessera-bench scale -kubeconfig K -ensure-nodes 50                   # only make 50 fake nodes

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-dev/tessera/internal/bench/scale"
)

func scaleMain(args []string) int {
	fs := flag.NewFlagSet("tessera-bench scale", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig of the scale cluster (hack/scale/cluster.sh env)")
	nodesFlag := fs.String("nodes", "100,500,1000", "cluster sizes to measure, comma-separated, in order")
	workloads := fs.String("workloads", "", "workloads to run, comma-separated (default all: "+strings.Join(scale.WorkloadNames(), ",")+")")
	pods := fs.Int("pods", 0, "pods per run (0: 3 per node, at most 500)")
	profile := fs.String("profile", "hgx-h100", "mock node profile of the fake nodes")
	namespace := fs.String("namespace", "tessera-scale", "namespace of the benchmark's pods")
	workers := fs.Int("workers", 16, "create requests in flight at once")
	qps := fs.Float64("qps", 5000, "client QPS and burst of the benchmark itself")
	stall := fs.Duration("stall", time.Minute, "end a run when no pod was bound for this long")
	cleanupTimeout := fs.Duration("cleanup-timeout", 5*time.Minute, "wait at most this long for a run's pods and claims to go")
	out := fs.String("out", "results", "directory for scale.md, scale.png and scale.json")
	clusterEnv := fs.String("cluster-env", "", "key=value file describing the cluster (hack/scale/cluster.sh writes one), quoted in the report")
	cpu := fs.String("cpu", "", "name=pid,… of processes whose CPU time each run records (kube-scheduler and kube-apiserver are shown per pod; hack/scale/cluster.sh bench passes the control plane's)")
	render := fs.String("render", "", "only rewrite scale.md and scale.png in -out from this scale.json (no cluster needed)")
	peerRuns := fs.Int("peer-runs", 3, "runs of the peer experiment (whole-GPU claims on Tessera's slices and on NVIDIA's DRA driver's, alternating); 0 skips it")
	migFills := fs.String("mig-fills", "0,4,7", "GPUs of 8 taken on every node before each run of the dynamic-MIG experiment, comma-separated; empty skips it")
	expNodes := fs.Int("experiment-nodes", 500, "fake nodes of the peer and dynamic-MIG experiments")
	expPods := fs.Int("experiment-pods", 300, "pods per run of the peer and dynamic-MIG experiments")
	ensure := fs.Int("ensure-nodes", -1, "only make the cluster's fake nodes exactly this many (with Tessera's DeviceClasses) and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "tessera-bench scale: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *render != "" {
		if err := rerender(*render, *out); err != nil {
			fmt.Fprintf(os.Stderr, "tessera-bench scale: %v\n", err)
			return 1
		}
		return 0
	}
	exp := experiments{peerRuns: *peerRuns, migFills: *migFills, nodes: *expNodes, pods: *expPods}
	if err := runScale(args, *kubeconfig, *nodesFlag, *workloads, *pods, *profile, *namespace, *workers, *qps, *stall, *cleanupTimeout, *out, *clusterEnv, *cpu, *ensure, exp); err != nil {
		fmt.Fprintf(os.Stderr, "tessera-bench scale: %v\n", err)
		return 1
	}
	return 0
}

func runScale(args []string, kubeconfig, nodesFlag, workloads string, pods int, profile, namespace string, workers int, qps float64,
	stall, cleanupTimeout time.Duration, out, clusterEnv, cpu string, ensure int, exp experiments) error {
	if kubeconfig == "" {
		return fmt.Errorf("-kubeconfig is required (hack/scale/cluster.sh env prints it)")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	rc.QPS, rc.Burst = float32(qps), int(qps)
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if ensure >= 0 {
		if err := scale.EnsureDeviceClasses(ctx, client); err != nil {
			return err
		}
		return scale.EnsureNodes(ctx, client, ensure, profile, workers, 10*time.Minute)
	}

	var nodes []int
	for _, f := range strings.Split(nodesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-nodes %q: %q is not a positive number", nodesFlag, f)
		}
		nodes = append(nodes, n)
	}
	procs, err := scale.ParseProcesses(cpu)
	if err != nil {
		return fmt.Errorf("-cpu: %w", err)
	}
	var names []string
	if workloads != "" {
		names = strings.Split(workloads, ",")
	}
	rep := scale.Report{Started: time.Now(), Host: scale.ReadHost(), Command: "tessera-bench scale " + strings.Join(args, " ")}
	if clusterEnv != "" {
		if rep.Cluster, err = readEnv(clusterEnv); err != nil {
			return err
		}
	}
	if rep.Slices, err = scale.SliceSummary(profile); err != nil {
		return err
	}
	fills, err := exp.fills()
	if err != nil {
		return err
	}
	cfg := scale.Config{
		Client: client, Nodes: nodes, Workloads: names, Pods: pods, Profile: profile, Namespace: namespace,
		Workers: workers, Stall: stall, Cleanup: cleanupTimeout, Log: os.Stderr, Load: scale.Load1, Processes: procs,
	}
	if rep.Results, err = scale.Bench(ctx, cfg); err != nil {
		return err
	}
	if exp.peerRuns > 0 {
		if rep.PeerSlices, err = scale.PublisherSummary(scale.NVIDIAPublisher(profile)); err != nil {
			return err
		}
		if rep.Peer, err = scale.Peer(ctx, cfg, exp.nodes, exp.peerRuns, exp.pods); err != nil {
			return err
		}
	}
	if len(fills) > 0 {
		if rep.MIGSlices, err = scale.PublisherSummary(scale.DynamicMIGPublisher(scale.DynamicMIGProfile)); err != nil {
			return err
		}
		if rep.MIGFill, err = scale.MIGFill(ctx, cfg, exp.nodes, fills, exp.pods); err != nil {
			return err
		}
	}
	rep.Finished, rep.Host.LoadEnd = time.Now(), scale.LoadAvg()
	return write(&rep, out)
}

// rerender reads a scale.json and writes the report from it into out.
func rerender(path, out string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep scale.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return write(&rep, out)
}

// write puts scale.md, scale.png and scale.json for rep into out.
func write(rep *scale.Report, out string) error {
	var png bytes.Buffer
	if err := rep.WritePNG(&png); err != nil {
		return err
	}
	js, err := jsonFile("scale.json", rep)
	if err != nil {
		return err
	}
	if err := writeFiles(out, outFile{"scale.md", []byte(rep.Markdown())}, outFile{"scale.png", png.Bytes()}, js); err != nil {
		return err
	}
	fmt.Printf("wrote %s/scale.md, scale.png and scale.json\n", out)
	return nil
}

// readEnv reads key=value lines; blank lines and # comments are skipped.
func readEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not key=value", path, line)
		}
		env[k] = v
	}
	return env, s.Err()
}

// experiments are the peer and dynamic-MIG experiments' flags.
type experiments struct {
	peerRuns    int
	migFills    string
	nodes, pods int
}

// fills parses -mig-fills.
func (e experiments) fills() ([]int, error) {
	var out []int
	for _, f := range strings.Split(e.migFills, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		k, err := strconv.Atoi(f)
		if err != nil || k < 0 || k > 7 {
			return nil, fmt.Errorf("-mig-fills %q: %q is not 0 to 7 GPUs", e.migFills, f)
		}
		out = append(out, k)
	}
	return out, nil
}
