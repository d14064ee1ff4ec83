package scale

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the unit of utime and stime in /proc/<pid>/stat (USER_HZ, 100 on
// every Linux architecture Go supports).
const clockTicks = 100

// ProcessCPU returns the CPU time (user + system) process pid has used, from
// /proc/<pid>/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15) from a /proc/<pid>/stat
// line; the command name (field 2) may hold spaces and parentheses, so fields are
// counted from the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc stat line %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed /proc stat line %q: %d fields after the command", stat, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed /proc stat line %q: %w", stat, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// ParseProcesses reads "name=pid,name=pid" (the -cpu flag of tessera-bench scale).
func ParseProcesses(s string) (map[string]int, error) {
	out := map[string]int{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		pid, err := strconv.Atoi(v)
		if !ok || name == "" || err != nil || pid <= 0 {
			return nil, fmt.Errorf("%q is not name=pid", kv)
		}
		out[name] = pid
	}
	return out, nil
}

// cpuSnapshot is the CPU time of each named process now; processes it cannot
// read are left out.
func cpuSnapshot(procs map[string]int) map[string]time.Duration {
	out := make(map[string]time.Duration, len(procs))
	for name, pid := range procs {
		if d, err := ProcessCPU(pid); err == nil {
			out[name] = d
		}
	}
	return out
}

// cpuSince is after − before for every process in both.
func cpuSince(before, after map[string]time.Duration) map[string]time.Duration {
	out := make(map[string]time.Duration, len(after))
	for name, a := range after {
		if b, ok := before[name]; ok {
			out[name] = a - b
		}
	}
	return out
}
