package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/cdi"
	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/plugin"
	"github.com/tessera-dev/tessera/pkg/publish"
)

// Options sizes a run; the zero value is the full measurement.
type Options struct {
	// Profile is the mock NVML profile of the node; empty means hgx-h100.
	Profile string
	// Sequential is how many claims are prepared and unprepared one after
	// the other per backend; 0 means 500.
	Sequential int
	// Concurrent is how many claims are prepared at once in one round, and
	// Rounds how many rounds run per backend; 0 means 100 and 5.
	Concurrent, Rounds int
	// Backends are the isolation backends measured; empty means all three.
	Backends []configapi.Isolation
	// Dir is where the checkpoint, the MPS root and HAMi-core's library and
	// preload file go (on a node: --plugin-data-dir, on the root disk);
	// empty means a fresh temporary directory, removed afterwards.
	Dir string
	// RunDir is where what lives as long as a boot goes: the CDI specs
	// (cdi/) and the HAMiCore claims' directories (hami-claims/), on a node
	// /var/run/cdi and /var/run/tessera/hami-claims on the /run tmpfs; empty
	// means a fresh directory on a tmpfs (/dev/shm) when there is one, else
	// under Dir, removed afterwards.
	RunDir string
}

func (o Options) withDefaults() Options {
	if o.Profile == "" {
		o.Profile = "hgx-h100"
	}
	if o.Sequential <= 0 {
		o.Sequential = 500
	}
	if o.Concurrent <= 0 {
		o.Concurrent = 100
	}
	if o.Rounds <= 0 {
		o.Rounds = 5
	}
	if len(o.Backends) == 0 {
		o.Backends = slices.Clone(configapi.SupportedIsolations)
	}
	return o
}

// Latency summarises the prepare+unprepare times of Claims claims.
type Latency struct {
	Claims         int
	P50, P99, Max  time.Duration
	Wall           time.Duration // the whole phase, for throughput
	ClaimsPerRound int           `json:",omitempty"`
}

// Backend is one isolation backend's latencies.
type Backend struct {
	Isolation configapi.Isolation
	// Sequential: one claim at a time. Concurrent: Options.Concurrent
	// claims at once, over all rounds.
	Sequential, Concurrent Latency
}

// Memory is the process's resident memory in bytes (see the package
// documentation for what it covers). RSS is VmRSS, Anon its anonymous part
// (RssAnon: heap, stacks), HWM is VmHWM. The rest of VmRSS is mostly the
// binary's mapped pages, which varies with the page cache from one run to the
// next; Anon is the figure that reflects what the program allocates.
type Memory struct {
	// Base is read when Run starts, before the plugin is built: the
	// process without the plugin (Go runtime, the binary's packages).
	BaseRSS, BaseAnon int64
	// Idle is read after New and the first publish.
	IdleRSS, IdleAnon, IdleHWM int64
	// LoadPeak is the highest value sampled (every 2 ms) during the
	// concurrent rounds, LoadHWM VmHWM after them.
	LoadPeakRSS, LoadPeakAnon, LoadHWM int64
}

// APIWrites counts ResourceSlice writes.
type APIWrites struct {
	// Slices is the number of slices the node publishes.
	Slices int
	// Publish is the first publication of the node.
	Publish Writes
	// Republish is a second publication of identical resources
	// (PublishResources called again; publish.Inventory does not even call
	// it when nothing changed, see InventorySkipsUnchanged).
	Republish Writes
	// InventorySkipsUnchanged is true when publish.Inventory.Sync found
	// nothing to publish on an unchanged node.
	InventorySkipsUnchanged bool
	// HealthChange is one GPU turning unhealthy: a NoSchedule taint on its
	// two devices, published through publish.Inventory.
	HealthChange Writes
}

// Report is one run.
type Report struct {
	Profile string
	GPUs    int
	// Filesystems are the types of the filesystems of Options.Dir
	// ("checkpoint") and Options.RunDir ("run"), as statfs(2) tells them
	// ("ext4", "tmpfs", or the magic number in hex).
	Filesystems map[string]string
	// GOMAXPROCS of the measuring process.
	Procs    int
	Backends []Backend
	Memory   Memory
	Writes   APIWrites
}

// JSON encodes the report (for a parent process to read).
func (r Report) JSON() ([]byte, error) { return json.Marshal(r) }

// ParseReport decodes what JSON wrote.
func ParseReport(data []byte) (Report, error) {
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return Report{}, fmt.Errorf("node report: %w", err)
	}
	return r, nil
}

const nodeName = "bench-node"

// node is the plugin under test with what it runs on.
type node struct {
	plugin *plugin.Plugin
	store  *checkpoint.File
	specs  *cdi.Dir
	gpus   []gpu.GPU
	api    *apiServer
	pub    *slicePublisher
	inv    *publish.Inventory

	taintsMu sync.Mutex
	taints   map[string][]resourceapi.DeviceTaint
}

// Run measures; see the package documentation.
func Run(ctx context.Context, opts Options) (Report, error) {
	opts = opts.withDefaults()
	ctx = klog.NewContext(ctx, logr.Discard())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	base, err := readProcStatus()
	if err != nil {
		return Report{}, err
	}

	dir := opts.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "tessera-nodebench-")
		if err != nil {
			return Report{}, err
		}
		defer func() { _ = os.RemoveAll(tmp) }()
		dir = tmp
	}

	runDir := opts.RunDir
	if runDir == "" {
		tmp, err := volatileTemp(dir)
		if err != nil {
			return Report{}, err
		}
		defer func() { _ = os.RemoveAll(tmp) }()
		runDir = tmp
	}

	n, err := startNode(ctx, opts.Profile, dir, runDir)
	if err != nil {
		return Report{}, err
	}
	defer n.pub.stop()

	rep := Report{Profile: opts.Profile, GPUs: len(n.gpus), Procs: procs(),
		Filesystems: map[string]string{"checkpoint": fsType(dir), "run": fsType(runDir)}}
	rep.Memory.BaseRSS, rep.Memory.BaseAnon = base.RSS, base.Anon
	if err := n.publishFirst(ctx, &rep.Writes); err != nil {
		return Report{}, err
	}
	idle, err := readProcStatus()
	if err != nil {
		return Report{}, err
	}
	rep.Memory.IdleRSS, rep.Memory.IdleAnon, rep.Memory.IdleHWM = idle.RSS, idle.Anon, idle.HWM

	sampler := startRSSSampler(2 * time.Millisecond)
	concurrent := make(map[configapi.Isolation]Latency, len(opts.Backends))
	for _, iso := range opts.Backends {
		l, err := n.concurrent(ctx, iso, opts.Concurrent, opts.Rounds)
		if err != nil {
			_ = sampler.Stop()
			return Report{}, err
		}
		concurrent[iso] = l
	}
	peak := sampler.Stop()
	rep.Memory.LoadPeakRSS, rep.Memory.LoadPeakAnon = peak.RSS, peak.Anon
	load, err := readProcStatus()
	if err != nil {
		return Report{}, err
	}
	rep.Memory.LoadHWM = load.HWM

	for _, iso := range opts.Backends {
		seq, err := n.sequential(ctx, iso, opts.Sequential)
		if err != nil {
			return Report{}, err
		}
		rep.Backends = append(rep.Backends, Backend{Isolation: iso, Sequential: seq, Concurrent: concurrent[iso]})
	}
	if err := n.assertClean(); err != nil {
		return Report{}, err
	}

	if err := n.republish(ctx, &rep.Writes); err != nil {
		return Report{}, err
	}
	if err := n.healthChange(ctx, &rep.Writes); err != nil {
		return Report{}, err
	}
	return rep, nil
}
