package node

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// procStatus is what /proc/self/status says about the process's memory, in
// bytes: VmRSS, VmHWM and VmRSS's anonymous part, RssAnon. The rest of VmRSS
// is mostly the mapped binary, whose resident share depends on the page
// cache rather than on the program.
type procStatus struct {
	RSS, HWM, Anon int64
}

// readProcStatus reads /proc/self/status; without /proc it returns zeros.
func readProcStatus() (procStatus, error) {
	data, err := os.ReadFile("/proc/self/status")
	if os.IsNotExist(err) {
		return procStatus{}, nil
	}
	if err != nil {
		return procStatus{}, err
	}
	return parseProcStatus(data)
}

func parseProcStatus(data []byte) (procStatus, error) {
	var s procStatus
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, value, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		var dst *int64
		switch string(key) {
		case "VmRSS":
			dst = &s.RSS
		case "VmHWM":
			dst = &s.HWM
		case "RssAnon":
			dst = &s.Anon
		default:
			continue
		}
		fields := bytes.Fields(value)
		if len(fields) != 2 || string(fields[1]) != "kB" {
			return procStatus{}, fmt.Errorf("/proc/self/status: %s: unexpected value %q", key, value)
		}
		kb, err := strconv.ParseInt(string(fields[0]), 10, 64)
		if err != nil {
			return procStatus{}, fmt.Errorf("/proc/self/status: %s: %w", key, err)
		}
		*dst = kb << 10
	}
	return s, sc.Err()
}

// rssSampler records the highest VmRSS seen while it runs. VmHWM alone would
// do, but it also covers everything before the load; the sampled peak is the
// load's own.
type rssSampler struct {
	stop chan struct{}
	done sync.WaitGroup
	peak procStatus // RSS and Anon are separate maxima; HWM unused
}

func startRSSSampler(every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{})}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if st, err := readProcStatus(); err == nil {
				s.peak.RSS = max(s.peak.RSS, st.RSS)
				s.peak.Anon = max(s.peak.Anon, st.Anon)
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends sampling and returns the peaks of VmRSS and RssAnon.
func (s *rssSampler) Stop() procStatus {
	close(s.stop)
	s.done.Wait()
	return s.peak
}
