package checkpoint

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
)

// benchmarkPut measures one Put (replace) with 100 claims in the store.
func benchmarkPut(b *testing.B, fsys fileSystem) {
	f, _ := mustOpen(b, filepath.Join(b.TempDir(), "checkpoint.json"), bootA, fsys)
	for i := range 100 {
		if err := f.Put(testClaim(fmt.Sprintf("claim-%03d", i), PrepareCompleted)); err != nil {
			b.Fatal(err)
		}
	}
	c := testClaim("claim-050", PrepareStarted)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.State = []ClaimState{PrepareStarted, PrepareCompleted}[i%2]
		if err := f.Put(c); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPut100 is the real cost on this disk, fsyncs included.
func BenchmarkPut100(b *testing.B) { benchmarkPut(b, osFS{}) }

// BenchmarkPut100NoSync is the CPU part (encode, checksum, write, rename).
func BenchmarkPut100NoSync(b *testing.B) {
	fsys := newFaultFS()
	fsys.noSync = true
	benchmarkPut(b, fsys)
}

// BenchmarkPutConcurrent100 is 100 callers putting at once into a store of
// 100 claims, fsyncs included: ns/op is the wall time per Put, which group
// commit divides among the Puts of a batch.
func BenchmarkPutConcurrent100(b *testing.B) {
	f, _ := mustOpen(b, filepath.Join(b.TempDir(), "checkpoint.json"), bootA, osFS{})
	for i := range 100 {
		if err := f.Put(testClaim(fmt.Sprintf("claim-%03d", i), PrepareCompleted)); err != nil {
			b.Fatal(err)
		}
	}
	b.SetParallelism(max(1, 100/runtime.GOMAXPROCS(0)))
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			c := testClaim(fmt.Sprintf("claim-%03d", i%100), []ClaimState{PrepareStarted, PrepareCompleted}[i%2])
			if err := f.Put(c); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
