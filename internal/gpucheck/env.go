package gpucheck

import (
	"cmp"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// ProcessEnv is how a probe runs "in" a prepared container without a
// container runtime: the environment it gets and what of the spec could not
// be applied.
type ProcessEnv struct {
	// Env is the probe's environment: the host's (without CUDA, NVIDIA and
	// Tessera variables and LD_PRELOAD) plus the spec's, with container
	// paths that a mount provides rewritten to the mount's host path.
	Env []string
	// Emulated says how edits were applied outside a container.
	Emulated []string
	// NotApplied lists the edits a process outside a container cannot get.
	NotApplied []string
}

// preloadFile is the dynamic loader's preload list; a spec that mounts one
// is applied as LD_PRELOAD of the listed libraries' host paths.
const preloadFile = "/etc/ld.so.preload"

var tesseraGPURE = regexp.MustCompile(`^TESSERA_GPU_(\d+)$`)

// HostProcessEnv applies the edits that the CDI library injected into spec
// (process env, mounts, device nodes, hooks) to a process on the host,
// starting from host (os.Environ()):
//
//   - env: set; a value that is a mount's container path, or under one, is
//     rewritten to the host path (CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps
//     becomes the daemon's pipe directory);
//   - a mount of /etc/ld.so.preload: the libraries it lists become
//     LD_PRELOAD, at their host paths (HAMi-core's libvgpu.so);
//   - a mount whose host and container paths are the same is already there;
//   - device nodes: the container would see only its GPUs' nodes; the host
//     sees every GPU, so CUDA_VISIBLE_DEVICES is set to the spec's GPUs
//     (TESSERA_GPU_<minor>, by minor) unless the spec sets it;
//   - anything else (other mounts, hooks) is listed in NotApplied.
func HostProcessEnv(spec *oci.Spec, host []string) ProcessEnv {
	var out ProcessEnv
	var specEnv []string
	if spec.Process != nil {
		specEnv = spec.Process.Env
	}
	mounts := slices.Clone(spec.Mounts)
	// Longest container path first, so the most specific mount wins.
	slices.SortStableFunc(mounts, func(a, b oci.Mount) int { return cmp.Compare(len(b.Destination), len(a.Destination)) })
	used := make([]bool, len(mounts))
	translate := func(value string) (string, bool) {
		for i, m := range mounts {
			if value == m.Destination || strings.HasPrefix(value, strings.TrimSuffix(m.Destination, "/")+"/") {
				used[i] = true
				return m.Source + strings.TrimPrefix(value, m.Destination), true
			}
		}
		return value, false
	}

	env := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, kv := range specEnv {
		k, v, _ := strings.Cut(kv, "=")
		if nv, ok := translate(v); ok && nv != v {
			out.Emulated = append(out.Emulated, fmt.Sprintf("%s: container path %s is %s on the host", k, v, nv))
			v = nv
		}
		set(k, v)
	}

	for i, m := range mounts {
		if m.Destination != preloadFile {
			continue
		}
		used[i] = true
		data, err := os.ReadFile(m.Source)
		if err != nil {
			out.NotApplied = append(out.NotApplied, fmt.Sprintf("preload list %s (mounted at %s): %v", m.Source, preloadFile, err))
			continue
		}
		var libs []string
		for _, lib := range strings.Fields(string(data)) {
			hostLib, ok := translate(lib)
			if !ok {
				out.NotApplied = append(out.NotApplied, fmt.Sprintf("preloaded %s: no mount provides it", lib))
				continue
			}
			libs = append(libs, hostLib)
		}
		if len(libs) > 0 {
			set("LD_PRELOAD", strings.Join(libs, ":"))
			out.Emulated = append(out.Emulated, fmt.Sprintf("%s (mounted from %s): LD_PRELOAD=%s", preloadFile, m.Source, env["LD_PRELOAD"]))
		}
	}
	for i, m := range mounts {
		switch {
		case used[i]:
		case m.Source == m.Destination:
			// The same path on the host: nothing to do.
		default:
			out.NotApplied = append(out.NotApplied, fmt.Sprintf("mount %s at %s", m.Source, m.Destination))
		}
	}

	if _, ok := env["CUDA_VISIBLE_DEVICES"]; !ok {
		type gpuVar struct {
			minor int
			uuid  string
		}
		var gpus []gpuVar
		for k, v := range env {
			if m := tesseraGPURE.FindStringSubmatch(k); m != nil {
				minor, _ := strconv.Atoi(m[1]) // the pattern's group is digits
				gpus = append(gpus, gpuVar{minor, v})
			}
		}
		slices.SortFunc(gpus, func(a, b gpuVar) int { return cmp.Compare(a.minor, b.minor) })
		var uuids []string
		for _, g := range gpus {
			uuids = append(uuids, g.uuid)
		}
		if len(uuids) > 0 {
			set("CUDA_VISIBLE_DEVICES", strings.Join(uuids, ","))
			out.Emulated = append(out.Emulated, "CUDA_VISIBLE_DEVICES="+env["CUDA_VISIBLE_DEVICES"]+": stands in for the device nodes that limit a container to its GPUs")
		}
	}
	if spec.Linux != nil && len(spec.Linux.Devices) > 0 {
		var nodes []string
		for _, d := range spec.Linux.Devices {
			nodes = append(nodes, d.Path)
		}
		out.Emulated = append(out.Emulated, "device nodes "+strings.Join(nodes, ", ")+": the host has them all; CUDA_VISIBLE_DEVICES picks the GPU")
	}
	if h := spec.Hooks; h != nil {
		// Prestart is deprecated in the runtime spec, but a spec may still
		// name such hooks, and the check lists every hook it does not run.
		//nolint:staticcheck // SA1019: read, not used, on purpose (above)
		for _, stage := range []struct {
			name  string
			hooks []oci.Hook
		}{{"prestart", h.Prestart}, {"createRuntime", h.CreateRuntime}, {"createContainer", h.CreateContainer}, {"startContainer", h.StartContainer}, {"poststart", h.Poststart}, {"poststop", h.Poststop}} {
			for _, hook := range stage.hooks {
				out.NotApplied = append(out.NotApplied, fmt.Sprintf("%s hook %s", stage.name, strings.Join(hook.Args, " ")))
			}
		}
	}

	out.Env = withoutCUDAEnv(host)
	for _, k := range order {
		out.Env = append(out.Env, k+"="+env[k])
	}
	return out
}

// withoutCUDAEnv drops the variables that would change what a probe or an
// MPS daemon sees: the host shell's CUDA_*, NVIDIA_*, TESSERA_* and
// LD_PRELOAD.
func withoutCUDAEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "NVIDIA_") || strings.HasPrefix(k, "TESSERA_") || k == "LD_PRELOAD" {
			continue
		}
		out = append(out, kv)
	}
	return out
}
