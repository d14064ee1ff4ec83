package plugin

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// BenchmarkPrepareUnprepare measures one claim's prepare plus unprepare in
// mock mode with the real checkpoint file and CDI directory, and reports the
// 50th and 99th percentile per claim. Run: go test -bench PrepareUnprepare ./pkg/plugin
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
