package gpucheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tessera-dev/tessera/internal/gpucheck/cuda"
)

// probeFail is a probe process's way to fail: it reports err as an "error"
// message on enc, its text after prefix, and returns err.
func probeFail(enc *json.Encoder, prefix string) func(error) error {
	return func(err error) error {
		_ = enc.Encode(probeMessage{Event: "error", Error: prefix + err.Error()})
		return err
	}
}

// awaitStart reports m ("ready") on enc and waits for the start line on rd.
func awaitStart(enc *json.Encoder, rd *bufio.Reader, m probeMessage, fail func(error) error) error {
	if err := enc.Encode(m); err != nil {
		return err
	}
	if _, err := rd.ReadString('\n'); err != nil {
		return fail(fmt.Errorf("wait for the start signal: %w", err))
	}
	return nil
}

// awaitCheck reports m ("holding") on enc and waits for the check's line on
// rd; the end of the input counts as one.
func awaitCheck(enc *json.Encoder, rd *bufio.Reader, m probeMessage, fail func(error) error) error {
	if err := enc.Encode(m); err != nil {
		return err
	}
	if _, err := rd.ReadString('\n'); err != nil && !errors.Is(err, io.EOF) {
		return fail(fmt.Errorf("wait for the check: %w", err))
	}
	return nil
}

// launchFor calls launch (one kernel, run to its end) over and over for d
// and reports p with the work done: the blocks the kernels counted in
// counter past base, which must be one per block of every kernel.
func launchFor(lib *cuda.Lib, counter cuda.Ptr, base uint64, p *ComputeProbe, d time.Duration, launch func() error, enc *json.Encoder, fail func(error) error) error {
	start := time.Now()
	for time.Since(start) < d {
		if err := launch(); err != nil {
			return fail(err)
		}
		p.Kernels++
	}
	p.Seconds = time.Since(start).Seconds()
	total, err := lib.ReadU64(counter)
	if err != nil {
		return fail(err)
	}
	p.CountedBlocks = total - base
	if want := uint64(p.Kernels) * uint64(p.Grid); p.CountedBlocks != want {
		return fail(fmt.Errorf("the kernels counted %d blocks, want %d (%d kernels × %d blocks)", p.CountedBlocks, want, p.Kernels, p.Grid))
	}
	return enc.Encode(probeMessage{Event: "result", Compute: p})
}
