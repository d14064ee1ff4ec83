package gpucheck

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// InsideExpect is what the container check expects a process in the
// container to see, written by the check from the CDI spec as the CDI
// library injected it, and mounted read-only at /tessera/expect.json.
type InsideExpect struct {
	// Env are the spec's variables, KEY=VALUE, each of which the process
	// must have exactly so: nothing translates them in a container.
	Env []string `json:"env"`
	// Devices are the device nodes the spec names, with their numbers.
	Devices []InsideDevice `json:"devices"`
	// Mounts are the container paths the spec mounts something at.
	Mounts []string `json:"mounts"`
}

// InsideDevice is one expected device node.
type InsideDevice struct {
	Path  string `json:"path"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

// InsideReport is what the probe saw in the container.
type InsideReport struct {
	PID int `json:"pid"`
	UID int `json:"uid"`
	// EnvWrong are the spec's variables the process does not have as the
	// spec says (missing, or another value: "KEY=got (spec: want)").
	EnvWrong []string `json:"envWrong,omitempty"`
	// Env is the process's whole environment.
	Env []string `json:"env"`
	// DevicesWrong are device nodes missing or not the spec's (type or
	// numbers); Devices the ones that are right.
	DevicesWrong []string `json:"devicesWrong,omitempty"`
	Devices      []string `json:"devices,omitempty"`
	// MountsMissing are container paths the spec mounts that do not exist.
	MountsMissing []string `json:"mountsMissing,omitempty"`
	// Preload is /etc/ld.so.preload as the process sees it (HAMi-core).
	Preload string `json:"preload,omitempty"`
}

// OK reports whether the process saw everything the spec says.
func (r InsideReport) OK() bool {
	return len(r.EnvWrong) == 0 && len(r.DevicesWrong) == 0 && len(r.MountsMissing) == 0
}

// Inspect compares what this process sees (env: its environment) with what
// the spec says.
func Inspect(exp InsideExpect, env []string) InsideReport {
	r := InsideReport{PID: os.Getpid(), UID: os.Getuid(), Env: env}
	have := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		have[k] = v
	}
	for _, kv := range exp.Env {
		k, v, _ := strings.Cut(kv, "=")
		got, ok := have[k]
		switch {
		case !ok:
			r.EnvWrong = append(r.EnvWrong, k+" missing (spec: "+v+")")
		case got != v:
			r.EnvWrong = append(r.EnvWrong, fmt.Sprintf("%s=%s (spec: %s)", k, got, v))
		}
	}
	for _, d := range exp.Devices {
		var st unix.Stat_t
		if err := unix.Stat(d.Path, &st); err != nil {
			r.DevicesWrong = append(r.DevicesWrong, fmt.Sprintf("%s: %v", d.Path, err))
			continue
		}
		rdev := uint64(st.Rdev) //nolint:unconvert // uint32 on some platforms
		major, minor := int64(unix.Major(rdev)), int64(unix.Minor(rdev))
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFCHR:
			r.DevicesWrong = append(r.DevicesWrong, d.Path+": not a character device")
		case major != d.Major || minor != d.Minor:
			r.DevicesWrong = append(r.DevicesWrong, fmt.Sprintf("%s: %d:%d (spec: %d:%d)", d.Path, major, minor, d.Major, d.Minor))
		default:
			r.Devices = append(r.Devices, fmt.Sprintf("%s %d:%d", d.Path, major, minor))
		}
	}
	for _, m := range exp.Mounts {
		if _, err := os.Stat(m); err != nil {
			r.MountsMissing = append(r.MountsMissing, fmt.Sprintf("%s: %v", m, err))
		}
	}
	if data, err := os.ReadFile(preloadFile); err == nil {
		r.Preload = strings.TrimSpace(string(data))
	}
	slices.Sort(r.Env)
	return r
}

// RunInside is the probe in the container: it reads the expectation,
// reports what it sees ("inside"), then runs memory (the memory probe, on
// the same stdin and stdout) so that the check can hold its figure to the
// share's limit.
func RunInside(in io.Reader, out io.Writer, expectPath string, memory func(io.Reader, io.Writer) error) error {
	enc := json.NewEncoder(out)
	data, err := os.ReadFile(expectPath)
	if err != nil {
		_ = enc.Encode(probeMessage{Event: "error", Error: err.Error()})
		return err
	}
	var exp InsideExpect
	if err := json.Unmarshal(data, &exp); err != nil {
		_ = enc.Encode(probeMessage{Event: "error", Error: fmt.Sprintf("%s: %v", expectPath, err)})
		return err
	}
	r := Inspect(exp, os.Environ())
	if err := enc.Encode(probeMessage{Event: "inside", Inside: &r}); err != nil {
		return err
	}
	return memory(in, out)
}
