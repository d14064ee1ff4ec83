package gpucheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
)

// The container check: a prepared claim's CDI spec applied for real, in a
// container, with nothing rewritten. The CDI library (the one containerd and
// CRI-O use) reads the spec back and injects the claim's devices into an OCI
// runtime spec; the check adds what the NVIDIA container toolkit would add
// on a node (the driver's libraries, hostlibs.go), the probe binary and a
// file of what the probe must find; then
//
//   - as root, the bundle's static runc runs it (device nodes created from
//     their numbers, the spec's mounts, its environment, a new PID, IPC, UTS
//     and mount namespace, the device cgroup);
//   - otherwise (or when runc cannot run here) "tessera-gpu-probe nsexec"
//     applies the spec's mounts in a new user and mount namespace, binds the
//     spec's device nodes from the host and chroots into the root filesystem
//     (what unshare -rm and rootless runtimes do).
//
// The probe in the container ("probe inside") reports what it sees: each of
// the spec's variables exactly as the spec says, each device node with the
// spec's numbers, each mount point; then it runs the memory probe there, so
// a share's memory limit is measured in the container too.

// ContainerNamespace is the namespace (MPS trust domain) of the container
// check's claims: an MPS share gets a daemon of its own, started with the
// domain's shared-memory directory as its /dev/shm, as the daemon pod is.
const ContainerNamespace = "gc-ctr"

const (
	containerProbePath  = "/tessera/tessera-gpu-probe"
	containerExpectPath = "/tessera/expect.json"
)

// containerIsolations are the backends whose spec the container check
// applies (DriverMemory's limit needs the runtime's createRuntime hook on
// the container's cgroup, which neither runc without the toolkit's hook nor
// the fallback runs).
var containerIsolations = []configapi.Isolation{configapi.IsolationAdvisory, configapi.IsolationMPS, configapi.IsolationHAMiCore}

// containerChecks runs the container check for each checked backend that
// has one.
func (n *node) containerChecks(ctx context.Context) []Check {
	var out []Check
	for _, iso := range n.cfg.Isolations {
		if slices.Contains(containerIsolations, iso) {
			out = append(out, n.containerCheck(ctx, iso))
		}
	}
	return out
}

// containerRun is one container to run.
type containerRun struct {
	dir    string
	rootfs string
	spec   *oci.Spec
	expect InsideExpect
	// hostDev maps a device node's container path to the host node the
	// fallback binds (the CDI spec's hostPath).
	hostDev map[string]string
	// added says what the check added to the spec, standIns what a mock run
	// adds in place of what a GPU node has.
	added    []string
	standIns []string
}

// containerResult is what a container run gave.
type containerResult struct {
	// how says which way the container ran (and, when runc could not,
	// why).
	how    string
	inside *InsideReport
	memory *MemoryProbe
}

func (n *node) containerCheck(ctx context.Context, iso configapi.Isolation) Check {
	c := Check{Name: "CDI spec applied in a container: " + string(iso)}
	ep, ok := n.cfg.Prober.(ExecProber)
	if !ok {
		c.Status, c.Detail = StatusSkipped, "no probe processes (--no-probes)"
		return c
	}
	if reason := n.backendUnavailable(iso); reason != "" {
		c.Status, c.Detail = StatusSkipped, reason
		return c
	}
	if iso == configapi.IsolationMPS && !n.cfg.Mock && os.Geteuid() != 0 {
		c.Status, c.Detail = StatusSkipped, "not root: the spec gives an MPS client its domain's shared-memory directory as /dev/shm, and the check can start the domain's MPS daemon with that /dev/shm only in a mount namespace of its own, which needs root; a client and a server with different /dev/shm do not meet"
		return c
	}
	shares := n.claimsFor(ContainerNamespace, "gpucheck-ctr-"+strings.ToLower(string(iso)), iso, []int64{50})
	prep, err := n.prepareShares(ctx, shares)
	if err != nil {
		if iso == configapi.IsolationMPS && n.mps != nil && n.mps.NoNamespace() != "" {
			// Root without CAP_SYS_ADMIN and no user namespaces: the
			// domain's daemon cannot get its /dev/shm.
			c.Status, c.Detail = StatusSkipped, "the MPS daemon of the container's trust domain needs a mount namespace for its /dev/shm: "+n.mps.NoNamespace()
			return c
		}
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	defer prep.release()
	run, err := n.buildContainer(iso, prep.cdiIDs(shares[0].claim), ep)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	res, skip, err := n.runContainer(ctx, ep, run)
	switch {
	case skip != "":
		c.Status, c.Detail = StatusSkipped, skip
		return c
	case err != nil:
		c.Status, c.Detail = StatusError, fmt.Sprintf("%s: %v", res.how, err)
		return c
	}
	return n.judgeContainer(c, iso, run, res)
}

// backendUnavailable is why the machine cannot run backend iso at all ("":
// it can), as the backend's own check says.
func (n *node) backendUnavailable(iso configapi.Isolation) string {
	if n.noShares != "" {
		return n.noShares
	}
	switch iso {
	case configapi.IsolationMPS:
		if n.mps != nil {
			if _, err := exec.LookPath(n.mps.Binary); err != nil {
				return fmt.Sprintf("%s not found (%v)", n.mps.Binary, err)
			}
		}
	case configapi.IsolationHAMiCore:
		if n.cfg.HAMiCoreLibrary == "" {
			if n.cfg.HAMiCoreError != "" {
				return "no HAMi-core library: " + n.cfg.HAMiCoreError
			}
			if n.cfg.HAMiCoreSkipReason != "" {
				return n.cfg.HAMiCoreSkipReason
			}
			return "no HAMi-core library given (--hami-core-library=/path/to/libvgpu.so)"
		}
	}
	return ""
}

// baseSpec is the container before the CDI devices are injected: what
// `runc spec` makes, without a terminal or capabilities.
func baseSpec(rootfs string) *oci.Spec {
	return &oci.Spec{
		Version:  oci.Version,
		Hostname: "tessera-gpu-check",
		Root:     &oci.Root{Path: rootfs},
		Process: &oci.Process{
			User: oci.User{UID: 0, GID: 0}, Cwd: "/", NoNewPrivileges: true,
			Env: []string{"PATH=/bin:/usr/bin"},
		},
		Mounts: []oci.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &oci.Linux{
			Namespaces: []oci.LinuxNamespace{{Type: oci.PIDNamespace}, {Type: oci.IPCNamespace}, {Type: oci.UTSNamespace}, {Type: oci.MountNamespace}},
			Resources:  &oci.LinuxResources{Devices: []oci.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
		},
	}
}

// buildContainer injects the claim's CDI devices into a container spec and
// adds what the check needs to run the probe in it.
func (n *node) buildContainer(iso configapi.Isolation, ids []string, ep ExecProber) (*containerRun, error) {
	if len(ids) == 0 {
		return nil, errors.New("prepare returned no CDI device")
	}
	run := &containerRun{dir: filepath.Join(n.cfg.WorkDir, "ctr", strings.ToLower(string(iso))), hostDev: map[string]string{}}
	run.rootfs = filepath.Join(run.dir, "rootfs")
	if err := os.RemoveAll(run.dir); err != nil {
		return nil, err
	}
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(run.rootfs, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(filepath.Join(run.rootfs, "tmp"), 0o1777); err != nil {
		return nil, err
	}
	if n.cfg.RootFS != "" {
		if err := copyFile(filepath.Join(n.cfg.RootFS, "bin", "busybox"), filepath.Join(run.rootfs, "bin", "busybox"), 0o755); err != nil {
			return nil, fmt.Errorf("the bundle's root filesystem: %w", err)
		}
	}

	// The CDI library reads the spec back and injects the devices, as the
	// runtime would.
	spec := baseSpec(run.rootfs)
	base := slices.Clone(spec.Mounts)
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(n.cdiDirs...), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI: %w", err)
	}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		return nil, fmt.Errorf("CDI: inject %v: %w (unresolved %v; spec errors %v)", ids, err, unresolved, cache.GetErrors())
	}
	for _, id := range ids {
		d := cache.GetDevice(id)
		if d == nil {
			continue
		}
		nodes := slices.Clone(d.ContainerEdits.DeviceNodes)
		if s := d.GetSpec(); s != nil {
			nodes = append(nodes, s.ContainerEdits.DeviceNodes...)
		}
		for _, dn := range nodes {
			host := dn.HostPath
			if host == "" {
				host = dn.Path
			}
			run.hostDev[dn.Path] = host
		}
	}

	// A mock node's spec names no device nodes (the plugin's mock mode:
	// environment only). Stand-ins with /dev/null's numbers take the place
	// of the GPU's three, so that creating and binding device nodes runs.
	if n.cfg.Mock && len(spec.Linux.Devices) == 0 {
		major, minor := int64(1), int64(3)
		for _, name := range []string{fmt.Sprintf("nvidia%d", n.gpu.Minor), "nvidiactl", "nvidia-uvm"} {
			path := "/dev/" + name
			spec.Linux.Devices = append(spec.Linux.Devices, oci.LinuxDevice{Path: path, Type: "c", Major: major, Minor: minor})
			spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices, oci.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rwm"})
			run.hostDev[path] = "/dev/null"
			run.standIns = append(run.standIns, path+" (stand-in: /dev/null, 1:3)")
		}
	}

	// What the probe must find: the spec's environment, device nodes and
	// mount points, before the check adds its own.
	for _, kv := range spec.Process.Env {
		if !strings.HasPrefix(kv, "PATH=") {
			run.expect.Env = append(run.expect.Env, kv)
		}
	}
	for _, d := range spec.Linux.Devices {
		run.expect.Devices = append(run.expect.Devices, InsideDevice{Path: d.Path, Major: d.Major, Minor: d.Minor})
	}
	var preload []string
	for _, m := range spec.Mounts {
		if slices.ContainsFunc(base, func(b oci.Mount) bool { return b.Destination == m.Destination && b.Source == m.Source }) {
			continue
		}
		run.expect.Mounts = append(run.expect.Mounts, m.Destination)
		if m.Destination == preloadFile {
			preload = preloadedHostLibs(m.Source, spec.Mounts)
		}
	}

	// What the NVIDIA container toolkit would add on a node: the driver's
	// libraries (and the loader and glibc the probe links).
	self := ep.Command[0]
	libs, err := findContainerLibs(self, !n.cfg.Mock, preload)
	if err != nil {
		return nil, err
	}
	if len(libs.MissingPreload) > 0 {
		return nil, fmt.Errorf("the preloaded %s needs %s, which this host does not have: the loader would refuse the preload and the container would run without it", strings.Join(preload, ", "), strings.Join(libs.MissingPreload, ", "))
	}
	add := func(dest, src string) {
		spec.Mounts = append(spec.Mounts, oci.Mount{Destination: dest, Type: "bind", Source: src, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	add(libs.Interp, libs.InterpHost)
	for _, l := range libs.Libs {
		add(containerLibDir+"/"+l.Name, l.Path)
	}
	run.added = append(run.added, fmt.Sprintf("%d libraries at %s (%s) and the loader at %s", len(libs.Libs), containerLibDir, libNames(libs.Libs), libs.Interp))
	if libs.DriverDir != "" {
		run.added = append(run.added, "driver libraries from "+libs.DriverDir)
	}
	if len(libs.Missing) > 0 {
		run.added = append(run.added, "not found on the host: "+strings.Join(libs.Missing, ", "))
	}
	if _, ok := envLookup(spec.Process.Env, "LD_LIBRARY_PATH"); ok {
		run.added = append(run.added, "the spec sets LD_LIBRARY_PATH itself: left as it is, so the mounted libraries may not be found")
	} else {
		spec.Process.Env = append(spec.Process.Env, "LD_LIBRARY_PATH="+containerLibDir)
		run.added = append(run.added, "LD_LIBRARY_PATH="+containerLibDir)
	}
	add(containerProbePath, self)
	add(containerExpectPath, filepath.Join(run.dir, "expect.json"))
	spec.Process.Args = append(append([]string{containerProbePath}, ep.Command[1:]...), "inside", "--expect", containerExpectPath)
	data, err := json.MarshalIndent(run.expect, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(run.dir, "expect.json"), data, 0o644); err != nil {
		return nil, err
	}
	run.spec = spec
	return run, nil
}

// preloadedHostLibs are the libraries a mounted /etc/ld.so.preload (host
// file src) lists, at the host paths the spec's mounts give them.
func preloadedHostLibs(src string, mounts []oci.Mount) []string {
	data, err := os.ReadFile(src)
	if err != nil {
		return nil
	}
	var out []string
	for _, lib := range strings.Fields(string(data)) {
		for _, m := range mounts {
			if lib == m.Destination || strings.HasPrefix(lib, strings.TrimSuffix(m.Destination, "/")+"/") {
				out = append(out, m.Source+strings.TrimPrefix(lib, m.Destination))
				break
			}
		}
	}
	return out
}

func libNames(libs []hostLib) string {
	names := make([]string, len(libs))
	for i, l := range libs {
		names[i] = l.Name
	}
	return strings.Join(names, " ")
}

func envLookup(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// runContainer runs the container with runc when it can, else with the
// namespace fallback. skip is set when neither can run on this machine.
func (n *node) runContainer(ctx context.Context, ep ExecProber, run *containerRun) (containerResult, string, error) {
	var runcErr error
	if os.Geteuid() == 0 && n.cfg.Runc != "" {
		res, err := n.runRunc(ctx, ep, run)
		if err == nil || res.inside != nil {
			return res, "", err
		}
		// runc did not get the probe going: say so, and run the fallback.
		runcErr = err
	}
	res, skip, err := n.runFallback(ctx, ep, run)
	switch {
	case runcErr != nil:
		res.how += fmt.Sprintf(" (runc %s could not run it: %v)", n.cfg.Runc, runcErr)
	case os.Geteuid() == 0:
		res.how += " (root, but no runc given: --runc)"
	}
	return res, skip, err
}

// runRunc runs the container with the bundle's runc.
func (n *node) runRunc(ctx context.Context, ep ExecProber, run *containerRun) (containerResult, error) {
	res := containerResult{how: "runc " + n.cfg.Runc}
	spec := *run.spec
	spec.Root = &oci.Root{Path: run.rootfs}
	data, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		return res, err
	}
	if err := os.WriteFile(filepath.Join(run.dir, "config.json"), data, 0o644); err != nil {
		return res, err
	}
	pidFile := filepath.Join(run.dir, "runc.pid")
	id := fmt.Sprintf("tgc-%d-%s", os.Getpid(), filepath.Base(run.dir))
	state := filepath.Join(run.dir, "runc-state")
	cmd := exec.CommandContext(ctx, n.cfg.Runc, "--root", state, "run", "--bundle", run.dir, "--pid-file", pidFile, id)
	defer func() {
		// Bounded: a runc that hangs must not hold the check.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		del := exec.CommandContext(dctx, n.cfg.Runc, "--root", state, "delete", "--force", id)
		del.WaitDelay = time.Second
		_ = del.Run()
	}()
	return n.talkToContainer(ep, cmd, res, func() int {
		data, err := os.ReadFile(pidFile)
		if err != nil {
			return 0
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		return pid
	})
}

// runFallback runs the container with nsexec in new namespaces: as root
// in a mount namespace, and when the kernel refuses that (root without
// CAP_SYS_ADMIN, as on a GPU machine that is itself a container) in a user
// and mount namespace (root mapped to root); otherwise in a user and mount
// namespace. skip says why neither could run.
func (n *node) runFallback(ctx context.Context, ep ExecProber, run *containerRun) (containerResult, string, error) {
	cfg, notApplied := fallbackConfig(run)
	path := filepath.Join(run.dir, "nsexec.json")
	if err := WriteNSExec(path, cfg); err != nil {
		return containerResult{}, "", err
	}
	attempts := []bool{true}
	if os.Geteuid() == 0 {
		attempts = []bool{false, true}
	}
	var refused []string
	for i, userns := range attempts {
		res := containerResult{how: "nsexec in a new mount namespace (root)"}
		if userns {
			res.how = fmt.Sprintf("nsexec in a new user and mount namespace (uid %d mapped to root, as unshare -rm)", os.Getuid())
		}
		if len(refused) > 0 {
			res.how += " (" + strings.Join(refused, "; ") + ")"
		}
		if len(notApplied) > 0 {
			res.how += "; not mounted: " + strings.Join(notApplied, ", ")
		}
		cmd := NSExecCommand(ep.Command[0], path, userns)
		p, err := ep.startCmd(cmd)
		if err != nil {
			denied := errors.Is(err, syscall.EPERM)
			switch {
			case denied && i+1 < len(attempts):
				refused = append(refused, fmt.Sprintf("a mount namespace alone was refused: %v", err))
				continue
			case userns:
				return res, strings.Join(append(refused, usernsUnavailable(err)), "; "), nil
			}
			return res, "", err
		}
		res, err = n.collect(ep, p, res, func() int { return cmd.Process.Pid })
		if err != nil && res.inside == nil && probeErrorCode(err) == ErrCodeNamespace {
			if i+1 < len(attempts) {
				refused = append(refused, fmt.Sprintf("in a mount namespace alone nsexec was refused: %v", err))
				continue
			}
			return res, strings.Join(append(refused, fmt.Sprintf("in a user and mount namespace nsexec was refused too: %v", err)), "; "), nil
		}
		return res, "", err
	}
	return containerResult{}, "", errors.New("no way to run the container")
}

// fallbackConfig is nsexec's config for the container: the spec's mounts,
// the device nodes a runtime creates and the spec's, bound from the host,
// and what could not be mounted.
func fallbackConfig(run *containerRun) (NSExec, []string) {
	cfg := NSExec{Root: run.rootfs, Args: run.spec.Process.Args, Env: run.spec.Process.Env, Dir: "/"}
	var notApplied []string
	for _, m := range run.spec.Mounts {
		ro := slices.Contains(m.Options, "ro")
		switch {
		case m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind"):
			cfg.Mounts = append(cfg.Mounts, NSMount{Type: "bind", Source: m.Source, Destination: m.Destination, ReadOnly: ro})
		case m.Type == "proc" || m.Type == "sysfs":
			// A user namespace may not mount a new proc or sysfs here (it
			// owns no PID or network namespace): the host's, bound.
			src := map[string]string{"proc": "/proc", "sysfs": "/sys"}[m.Type]
			if _, err := os.Stat(filepath.Join(src, "self")); m.Type == "proc" && err != nil {
				notApplied = append(notApplied, m.Type+" at "+m.Destination+" (no "+src+" here)")
				continue
			}
			if _, err := os.Stat(filepath.Join(src, "devices")); m.Type == "sysfs" && err != nil {
				notApplied = append(notApplied, m.Type+" at "+m.Destination+" (no "+src+" here)")
				continue
			}
			cfg.Mounts = append(cfg.Mounts, NSMount{Type: "bind", Source: src, Destination: m.Destination, ReadOnly: m.Type == "sysfs"})
		case m.Type == "devpts":
			cfg.Mounts = append(cfg.Mounts, NSMount{Type: "devpts", Destination: m.Destination})
		case m.Type == "tmpfs":
			var data []string
			for _, o := range m.Options {
				if strings.HasPrefix(o, "size=") || strings.HasPrefix(o, "mode=") {
					data = append(data, o)
				}
			}
			cfg.Mounts = append(cfg.Mounts, NSMount{Type: "tmpfs", Destination: m.Destination, Data: strings.Join(data, ",")})
		default:
			notApplied = append(notApplied, m.Type+" at "+m.Destination)
		}
	}
	// The device nodes a runtime creates in every container, then the
	// spec's, each bound from the host.
	for _, d := range []string{"null", "zero", "full", "random", "urandom"} {
		if _, err := os.Stat("/dev/" + d); err != nil {
			notApplied = append(notApplied, "/dev/"+d+" (not on this host)")
			continue
		}
		cfg.Mounts = append(cfg.Mounts, NSMount{Type: "bind", Source: "/dev/" + d, Destination: "/dev/" + d})
	}
	for _, d := range run.spec.Linux.Devices {
		host, ok := run.hostDev[d.Path]
		if !ok {
			host = d.Path
		}
		cfg.Mounts = append(cfg.Mounts, NSMount{Type: "bind", Source: host, Destination: d.Path})
	}
	return cfg, notApplied
}

// talkToContainer starts cmd and runs the protocol with the probe in it.
func (n *node) talkToContainer(ep ExecProber, cmd *exec.Cmd, res containerResult, pid func() int) (containerResult, error) {
	p, err := ep.startCmd(cmd)
	if err != nil {
		return res, err
	}
	return n.collect(ep, p, res, pid)
}

// collect reads the probe's "inside" report and its memory probe, reading
// the probe's memory from NVML (by its host PID) while it holds.
func (n *node) collect(ep ExecProber, p *probeProcess, res containerResult, pid func() int) (containerResult, error) {
	defer p.kill()
	m, err := p.next(ep.timeout(), "inside")
	if err != nil {
		return res, err
	}
	res.inside = m.Inside
	m, err = p.next(ep.timeout(), "holding")
	if err != nil {
		return res, err
	}
	if m.Memory == nil {
		return res, errors.New("probe: \"holding\" without figures")
	}
	probe := *m.Memory
	if ep.ProcessMemory != nil {
		if hostPID := pid(); hostPID > 0 {
			probe.ProcessBytes, probe.ProcessBytesKnown = ep.ProcessMemory(n.gpu.UUID, hostPID)
		}
	}
	res.memory = &probe
	if err := p.send("release"); err != nil {
		return res, err
	}
	if _, err := p.next(ep.timeout(), "result"); err != nil {
		return res, err
	}
	return res, nil
}

// judgeContainer turns what the probe saw into the check's outcome.
func (n *node) judgeContainer(c Check, iso configapi.Isolation, run *containerRun, res containerResult) Check {
	in := res.inside
	if in == nil {
		c.Status, c.Detail = StatusError, res.how+": the probe reported nothing from the container"
		return c
	}
	var bad []string
	bad = append(bad, prefixed("variable ", in.EnvWrong)...)
	bad = append(bad, prefixed("device ", in.DevicesWrong)...)
	bad = append(bad, prefixed("mount ", in.MountsMissing)...)
	var fig string
	if m := res.memory; m != nil {
		f := memoryFigures(n.memory, *m)
		fig = fmt.Sprintf("memory %.0f MiB obtained (%s) of a %.0f MiB limit", f.ObtainedMiB, f.ObtainedFrom, f.LimitMiB)
		if Enforces[iso].Memory {
			if math.Abs(f.ObtainedMiB-f.LimitMiB) > n.targets.MemoryToleranceMiB {
				bad = append(bad, fmt.Sprintf("%s: more than %.0f MiB from the limit", fig, n.targets.MemoryToleranceMiB))
			}
		} else {
			fig += " (not enforced)"
		}
	}
	detail := []string{res.how,
		fmt.Sprintf("%d of the spec's variables, %d device nodes (%s), %d mounts as the spec says", len(run.expect.Env)-len(in.EnvWrong), len(in.Devices), strings.Join(in.Devices, ", "), len(run.expect.Mounts)-len(in.MountsMissing))}
	if in.Preload != "" {
		detail = append(detail, "/etc/ld.so.preload: "+in.Preload)
	}
	if fig != "" {
		detail = append(detail, fig)
	}
	detail = append(detail, "added by the check: "+strings.Join(run.added, "; "))
	if len(run.standIns) > 0 {
		detail = append(detail, "mock: "+strings.Join(run.standIns, ", "))
	}
	if len(bad) > 0 {
		c.Status = StatusMismatch
		c.Detail = strings.Join(bad, "; ") + " — " + strings.Join(detail, "; ")
		return c
	}
	c.Status = StatusMeasured
	if n.cfg.Mock {
		c.Status = StatusSimulated
	}
	c.Detail = strings.Join(detail, "; ")
	return c
}

func prefixed(p string, items []string) []string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = p + s
	}
	return out
}
