package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-dev/tessera/internal/bench/fleet"
	"github.com/tessera-dev/tessera/internal/bench/replay"
	"github.com/tessera-dev/tessera/internal/bench/scale"
	"github.com/tessera-dev/tessera/pkg/model"
)

// replayFlags drive -replay: the KubeShare stream through the real
// kube-scheduler of the scale cluster (hack/scale/cluster.sh), compared with
// the simulator on the same stream.
type replayFlags struct {
	on         bool
	kubeconfig string
	nodes      int
	jobs       int
	speed      float64
	means      string
	models     string
	namespace  string
	from       string
	add        bool
	attempt    float64
}

func registerReplayFlags(fs *flag.FlagSet) *replayFlags {
	r := &replayFlags{}
	fs.BoolVar(&r.on, "replay", false, "replay the stream through the real kube-scheduler of the scale cluster and compare with the simulator (results/sim-vs-scheduler.md)")
	fs.StringVar(&r.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "replay: the scale cluster's admin kubeconfig (hack/scale/cluster.sh env)")
	fs.IntVar(&r.nodes, "replay-nodes", 4, "replay: fake 8-GPU nodes (made or removed to match)")
	fs.IntVar(&r.jobs, "replay-jobs", 600, "replay: jobs per stream")
	fs.Float64Var(&r.speed, "replay-speed", 20, "replay: simulated seconds per wall-clock second")
	fs.StringVar(&r.means, "replay-means", "0.3", "replay: mean demands of the normal streams, comma-separated")
	fs.StringVar(&r.models, "replay-models", "whole,tessera,partition", "replay: models, comma-separated (whole, tessera, partition: the fixed partitions' slices and classes replace Tessera's on the fake nodes for that row)")
	fs.StringVar(&r.namespace, "replay-namespace", "fleet-replay", "replay: namespace of the jobs' pods and claims (created if missing)")
	fs.StringVar(&r.from, "replay-from", "", "replay: take the real runs from this sim-vs-scheduler.json instead of a cluster and simulate them again")
	fs.BoolVar(&r.add, "replay-add", false, "replay: keep the rows of <out>/sim-vs-scheduler.json whose mean and model this run does not replay (simulated again), and add this run's")
	fs.Float64Var(&r.attempt, "replay-attempt-cost", 0, "replay: simulated seconds per scheduling attempt in the simulator (0: instantaneous)")
	return r
}

// replayRow is one stream and model, replayed and simulated.
type replayRow struct {
	mean                     float64
	kind                     fleet.Kind
	jobs                     []fleet.Job
	real, sim, simOld        fleet.Result
	wall, lag                time.Duration
	attemptsSim, attemptsOld int
}

// simulate measures the real starts and simulates the row's stream with the
// default model and the earlier one.
func (r *replayFlags) simulate(ctx context.Context, row *replayRow, realStarts []float64) error {
	kind, jobs := row.kind, row.jobs
	real, err := fleet.Summarize(kind, jobs, realStarts)
	if err != nil {
		return err
	}
	w := fleet.Workload{MeanDemand: row.mean}
	sim, err := fleet.Run(ctx, kind, w, jobs, fleet.Options{Nodes: r.nodes, AttemptCost: r.attempt})
	if err != nil {
		return err
	}
	old, err := fleet.Run(ctx, kind, w, jobs, fleet.Options{Nodes: r.nodes, Queue: fleet.QueueFIFO, NodeChoice: fleet.ChoiceFirst})
	if err != nil {
		return err
	}
	row.real = real
	row.sim, _ = fleet.Summarize(kind, jobs, sim.Starts)
	row.simOld, _ = fleet.Summarize(kind, jobs, old.Starts)
	row.attemptsSim, row.attemptsOld = sim.Attempts, old.Attempts
	fmt.Fprintf(os.Stderr, "replay: m=%.2f %s: real %.0f jobs/h, simulated %.0f (old model %.0f)\n", row.mean, kind, real.JobsPerHour, row.sim.JobsPerHour, row.simOld.JobsPerHour)
	return nil
}

// rawRow is one replay as saved in sim-vs-scheduler.json.
type rawRow struct {
	Mean   float64     `json:"mean"`
	Kind   fleet.Kind  `json:"kind"`
	Nodes  int         `json:"nodes"`
	Speed  float64     `json:"speed"`
	Jobs   []fleet.Job `json:"jobs"`
	Starts []float64   `json:"realStarts"`
	WallS  float64     `json:"wallSeconds"`
	LagS   float64     `json:"maxCreateLagSeconds"`
}

// row is the saved replay before it is simulated again.
func (x rawRow) row() replayRow {
	return replayRow{mean: x.Mean, kind: x.Kind, jobs: x.Jobs, wall: time.Duration(x.WallS * float64(time.Second)), lag: time.Duration(x.LagS * float64(time.Second))}
}

// stream is the job stream of mean demand m that a replay plays.
func (r *replayFlags) stream(seed int64, m float64) []fleet.Job {
	w := fleet.QuickConfig(seed).Workload
	w.Jobs, w.MeanDemand, w.GPUs = r.jobs, m, r.nodes*fleet.GPUsPerNode
	return w.Generate()
}

// kept reads the replays saved in path and simulates again those whose mean
// and model this run does not replay; they must have this run's nodes, speed
// and jobs per stream.
func (r *replayFlags) kept(ctx context.Context, path string, seed int64) ([]replayRow, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-replay-add: %w", err)
	}
	var raw []rawRow
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("-replay-add: %s: %w", path, err)
	}
	replayed := map[string]bool{}
	for _, ms := range strings.Split(r.means, ",") {
		m, _ := strconv.ParseFloat(strings.TrimSpace(ms), 64)
		for _, ks := range strings.Split(r.models, ",") {
			replayed[fmt.Sprintf("%.4f/%s", m, strings.TrimSpace(ks))] = true
		}
	}
	var rows []replayRow
	for _, x := range raw {
		if replayed[fmt.Sprintf("%.4f/%s", x.Mean, x.Kind)] {
			continue
		}
		if x.Nodes != r.nodes || x.Speed != r.speed || len(x.Jobs) != r.jobs {
			return nil, fmt.Errorf("-replay-add: %s: m=%.2f %s was replayed on %d nodes at %.0f× with %d jobs, this run uses %d, %.0f× and %d",
				path, x.Mean, x.Kind, x.Nodes, x.Speed, len(x.Jobs), r.nodes, r.speed, r.jobs)
		}
		if !reflect.DeepEqual(x.Jobs, r.stream(seed, x.Mean)) {
			return nil, fmt.Errorf("-replay-add: %s: m=%.2f %s replayed another stream than this run's seed %d makes", path, x.Mean, x.Kind, seed)
		}
		row := x.row()
		if err := r.simulate(ctx, &row, x.Starts); err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// rerun simulates the saved replays again (for tuning the simulator).
func (r *replayFlags) rerun(seed int64, out, command string) error {
	b, err := os.ReadFile(r.from)
	if err != nil {
		return err
	}
	var raw []rawRow
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("%s: %w", r.from, err)
	}
	var rows []replayRow
	for _, x := range raw {
		r.nodes, r.speed, r.jobs = x.Nodes, x.Speed, len(x.Jobs)
		row := x.row()
		if err := r.simulate(context.Background(), &row, x.Starts); err != nil {
			return err
		}
		rows = append(rows, row)
	}
	return r.write(rows, seed, out, command)
}

func (r *replayFlags) run(seed int64, out, command string) error {
	if r.from != "" {
		return r.rerun(seed, out, command)
	}
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", r.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %q: %w", r.kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := scale.EnsureNodes(ctx, c, r.nodes, fleet.Profile, 8, 5*time.Minute); err != nil {
		return fmt.Errorf("fake nodes: %w", err)
	}
	if err := ensureNamespace(ctx, c, r.namespace); err != nil {
		return err
	}
	var rows []replayRow
	if r.add {
		if rows, err = r.kept(ctx, filepath.Join(out, "sim-vs-scheduler.json"), seed); err != nil {
			return err
		}
	}
	for _, ms := range strings.Split(r.means, ",") {
		m, err := strconv.ParseFloat(strings.TrimSpace(ms), 64)
		if err != nil || m <= 0 || m > 1 {
			return fmt.Errorf("-replay-means: %q is not a mean demand in (0, 1]", ms)
		}
		jobs := r.stream(seed, m)
		for _, ks := range strings.Split(r.models, ",") {
			kind := fleet.Kind(strings.TrimSpace(ks))
			if kind != fleet.Whole && kind != fleet.Tessera && kind != fleet.Partition {
				return fmt.Errorf("-replay-models: %q: want whole, partition or tessera", ks)
			}
			fmt.Fprintf(os.Stderr, "replay: m=%.2f %s: %d jobs on %d nodes at %.0f× (about %.0f s)\n", m, kind, len(jobs), r.nodes, r.speed, jobs[len(jobs)-1].Arrival/r.speed)
			o, err := r.replayOne(ctx, c, kind, jobs)
			if err != nil {
				return err
			}
			row := replayRow{mean: m, kind: kind, jobs: jobs, wall: o.Wall, lag: o.MaxCreateLag}
			if err := r.simulate(ctx, &row, o.Starts); err != nil {
				return err
			}
			rows = append(rows, row)
			// Written after every row, so that a run cut short keeps what it measured.
			if err := r.write(rows, seed, out, command); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *replayFlags) write(rows []replayRow, seed int64, out, command string) error {
	md := replayMarkdown(rows, r, seed, command)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(out, "sim-vs-scheduler.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		return err
	}
	// The jobs and their real start times, to simulate them again later (-replay-from).
	var raw []rawRow
	for _, row := range rows {
		raw = append(raw, rawRow{row.mean, row.kind, r.nodes, r.speed, row.jobs, row.real.Starts, row.wall.Seconds(), row.lag.Seconds()})
	}
	js, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "sim-vs-scheduler.json"), js, 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s and sim-vs-scheduler.json\n", path)
	return nil
}

func pct(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%+.1f%%", 100*(a-b)/b)
}

func replayMarkdown(rows []replayRow, r *replayFlags, seed int64, command string) string {
	var b strings.Builder
	p := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	p("# The fleet simulator against the real kube-scheduler\n\n")
	p("Reproduce: `hack/scale/cluster.sh up %d` then `%s`, then `hack/scale/cluster.sh down`.\n\n", r.nodes, command)
	p("The KubeShare stream (Poisson arrivals at 1.25× the fluid capacity, demand Normal(m, 0.1), run time Exp(600 s), seed %d, %d jobs) "+
		"replayed %.0f× faster than simulated time through the real kube-apiserver, kube-scheduler and kube-controller-manager of the scale cluster "+
		"(hack/scale: %d kwok fake nodes × 8 GPUs, each with the ResourceSlices Tessera publishes for the hgx-h100 mock profile; "+
		"for the partition rows, the fixed partitions' slices and DeviceClasses the simulator uses, published in their place). "+
		"Each job is a ResourceClaim with the spec the simulator gives the allocator (fleet.ClaimSpec) and a pod using it, created at its arrival; "+
		"when the pod is bound it runs for its run time, then pod and claim are deleted (internal/bench/replay). The same stream is simulated with "+
		"kube-scheduler's queue and node choice (the default model) and with the earlier model (FIFO with head-of-line blocking, first node first). "+
		"The simulator's scheduling attempts take %.3g simulated seconds each. "+
		"All three are measured by fleet.Summarize: jobs completed per hour in the window (arrival of the first tenth of the jobs to the last arrival) "+
		"and waits from arrival to binding in simulated minutes.\n\n", seed, r.jobs, r.speed, r.nodes, r.attempt)
	p("| m | model | real jobs/h | simulated | sim vs real | earlier model | earlier vs real | real wait mean / p95 (min) | simulated | earlier model | replay wall | max create lag |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		p("| %.2f | %s | %.0f | %.0f | %s | %.0f | %s | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f | %s | %s |\n", row.mean, row.kind,
			row.real.JobsPerHour, row.sim.JobsPerHour, pct(row.sim.JobsPerHour, row.real.JobsPerHour),
			row.simOld.JobsPerHour, pct(row.simOld.JobsPerHour, row.real.JobsPerHour),
			row.real.WaitMean/60, row.real.WaitP95/60, row.sim.WaitMean/60, row.sim.WaitP95/60, row.simOld.WaitMean/60, row.simOld.WaitP95/60,
			row.wall.Round(time.Second), row.lag.Round(time.Millisecond))
	}
	p("\nTarget: simulated and real jobs/h within 10 %% for every model.\n\n")
	for _, row := range rows {
		d := (row.sim.JobsPerHour - row.real.JobsPerHour) / row.real.JobsPerHour
		ok := "met"
		if d > 0.1 || d < -0.1 {
			ok = "**missed**"
		}
		p("- m=%.2f %s: %s (%s)\n", row.mean, row.kind, pct(row.sim.JobsPerHour, row.real.JobsPerHour), ok)
	}
	return b.String()
}

func ensureNamespace(ctx context.Context, c kubernetes.Interface, ns string) error {
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	return nil
}

// replayOne replays jobs as kind. For fixed partitions it first publishes
// their slices and classes in place of Tessera's slices, and puts Tessera's
// back afterwards, whatever happened.
func (r *replayFlags) replayOne(ctx context.Context, c kubernetes.Interface, kind fleet.Kind, jobs []fleet.Job) (_ replay.Outcome, err error) {
	if kind == fleet.Partition {
		defer func() {
			restore := context.WithoutCancel(ctx)
			if rerr := scale.EnsureNodes(restore, c, r.nodes, fleet.Profile, 8, 5*time.Minute); rerr != nil {
				err = errors.Join(err, fmt.Errorf("fake nodes: put Tessera's slices back: %w", rerr))
			}
		}()
		if err := publishModel(ctx, c, r.nodes, kind); err != nil {
			return replay.Outcome{}, err
		}
	}
	return replay.Replay(ctx, replay.Config{Client: c, Namespace: r.namespace, Kind: kind, Jobs: jobs, Speed: r.speed,
		Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }})
}

// publishModel puts the slices and DeviceClasses the simulation publishes for
// kind on the first n fake nodes, in place of Tessera's slices. Only fixed
// partitions: the whole and Tessera models replay on Tessera's own slices
// and classes, which the simulator's would overwrite.
func publishModel(ctx context.Context, c kubernetes.Interface, n int, kind fleet.Kind) error {
	if kind != fleet.Partition {
		return fmt.Errorf("replay: model %s replays on Tessera's slices, not its own", kind)
	}
	_, classes, err := fleet.Published(kind, scale.NodeName(0))
	if err != nil {
		return err
	}
	if err := scale.EnsureClasses(ctx, c, classes); err != nil {
		return err
	}
	err = scale.PublishOnNodes(ctx, c, n, 8, scale.Publisher{
		Name:   "the " + string(kind) + " model",
		Driver: model.DriverName,
		Slices: func(node string) ([]resourceapi.ResourceSlice, error) {
			slices, _, err := fleet.Published(kind, node)
			out := make([]resourceapi.ResourceSlice, len(slices))
			for i, s := range slices {
				out[i] = *s
			}
			return out, err
		},
	})
	if err != nil {
		return fmt.Errorf("publish the %s model's slices: %w", kind, err)
	}
	return nil
}
