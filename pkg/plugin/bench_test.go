package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/mig"
)

// BenchmarkPrepareUnprepare measures one claim's prepare plus unprepare in
// mock mode with the real checkpoint file and CDI directory, and reports the
// 50th and 99th percentile per claim. Run: go test -bench PrepareUnprepare ./pkg/plugin.
func BenchmarkPrepareUnprepare(b *testing.B) {
	for _, iso := range []configapi.Isolation{configapi.IsolationAdvisory, configapi.IsolationMPS, configapi.IsolationHAMiCore} {
		b.Run(string(iso), func(b *testing.B) {
			e := newEnv(b)
			inst := e.start(nil)
			ctx := klog.NewContext(b.Context(), logr.Discard())
			durations := make([]time.Duration, 0, b.N)
			i := 0
			for b.Loop() {
				c := newClaim(fmt.Sprintf("uid-bench-%d", i), []result{share("gpu", "gpu-1-shared", fmt.Sprintf("s-%d", i), "4Gi", "10")},
					claimConfig(isolationConfig(iso)))
				i++
				start := time.Now()
				res, _ := inst.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
				if err := res[c.UID].Err; err != nil {
					b.Fatal(err)
				}
				un, _ := inst.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}})
				if err := un[c.UID]; err != nil {
					b.Fatal(err)
				}
				durations = append(durations, time.Since(start))
			}
			slices.Sort(durations)
			pct := func(p float64) float64 {
				return float64(durations[int(p*float64(len(durations)-1))].Microseconds())
			}
			b.ReportMetric(pct(0.50), "p50-µs/claim")
			b.ReportMetric(pct(0.99), "p99-µs/claim")
		})
	}
}

// driverTimed is MIGInstances that adds up the time of the driver's own
// create calls (mig.Created.Driver) of each prepare.
type driverTimed struct {
	MIGInstances
	driver time.Duration
}

func (d *driverTimed) Create(uuid string, profileID int, pl gpu.MIGPlacement, own string) (mig.Created, error) {
	c, err := d.MIGInstances.Create(uuid, profileID, pl, own)
	d.driver += c.Driver
	return c, err
}

// BenchmarkPrepareDynamicMIG measures the prepare of a claim for one
// dynamic MIG device (1g.10gb at slice 6 of GPU 1 of the hgx-h100-mig mock
// node, with the mock's MIG state file as in mock mode), and reports its
// percentiles without the driver's create time: the time inside
// nvmlDeviceCreateGpuInstanceWithPlacement and
// nvmlGpuInstanceCreateComputeInstance (mig.Created.Driver; on the mock an
// in-memory create plus its state-file write) is measured around those calls
// and subtracted per prepare. What is left is Tessera's: three checkpoint
// writes (intent, IDs, completed), NVML reads of the GPU's MIG state (mock),
// the CDI spec. Files lie as on a node: the checkpoint and the mock's
// state file in a temporary directory on the root disk, the CDI specs on
// /dev/shm where that is a tmpfs (a node's /var/run/cdi is on the /run
// tmpfs), else on the root disk too (b.Log says which). Unprepare (destroy)
// is not timed. Run: go test -run '^$' -bench PrepareDynamicMIG ./pkg/plugin.
func BenchmarkPrepareDynamicMIG(b *testing.B) {
	e := newEnv(b)
	if dir, err := os.MkdirTemp("/dev/shm", "tessera-bench-cdi-"); err == nil {
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
		e.cdiRoot = dir
	}
	b.Logf("CDI specs in %s, checkpoint in %s", e.cdiRoot, filepath.Dir(e.checkpoint))
	node, err := gpu.NewMockNodeWith("hgx-h100-mig", gpu.MockOptions{MIGStateFile: filepath.Join(b.TempDir(), "mig.json")})
	if err != nil {
		b.Fatal(err)
	}
	timed := &driverTimed{}
	inst := e.startMIG(node, func(o *Options) {
		timed.MIGInstances = o.MIG
		o.MIG = timed
	})
	ctx := klog.NewContext(b.Context(), logr.Discard())
	var without, driver []time.Duration
	i := 0
	for b.Loop() {
		c := newClaim(fmt.Sprintf("uid-mig-%d", i), []result{whole("mig", "gpu-1-mig-1g-10gb-6")})
		i++
		timed.driver = 0
		start := time.Now()
		res, _ := inst.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		took := time.Since(start)
		if err := res[c.UID].Err; err != nil {
			b.Fatal(err)
		}
		without, driver = append(without, took-timed.driver), append(driver, timed.driver)
		b.StopTimer()
		un, _ := inst.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}})
		if err := un[c.UID]; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	slices.Sort(without)
	slices.Sort(driver)
	pct := func(d []time.Duration, p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) }
	b.ReportMetric(pct(without, 0.50), "p50-µs/prepare")
	b.ReportMetric(pct(without, 0.99), "p99-µs/prepare")
	b.ReportMetric(pct(driver, 0.99), "p99-µs/driver-create")
}
