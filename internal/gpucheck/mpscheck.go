package gpucheck

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	configapi "github.com/tessera-dev/tessera/api/gpu.tessera.dev/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/isolation"
)

// The MPS checks beyond the backend's limits, each in trust domains (claim
// namespaces) of its own, so each has its own control daemon started
// through the plugin's path (prepare → isolation.MPS.Acquire → LocalMPS):
//
//   - a root client, then a client of uid 1000 (legacy MPS: the second
//     uid's client waits until the first uid's server has no clients and
//     exits; the wait must end within MPSUIDWaitBound), each shown by the
//     control daemon (get_server_list, get_client_list) to be a client of a
//     server of its own uid;
//   - two trust domains on one GPU: each domain's client's fixed-work rate
//     alone and together (separate servers are separate contexts, which
//     time-slice: each about half), against two clients of one domain (one
//     server: side by side, each about its whole rate);
//   - the memory one server's context takes (NVML's used memory before and
//     after the server starts, and per client).

// Trust domains (claim namespaces) of the MPS checks. Variables, so that a
// test can put "two domains" into one and see the check fail. Short: each
// names a directory in the path of the daemon's sockets (maxMPSSocketPath).
var (
	mpsUIDDomain = "gc-uid"
	mpsDomainA   = "gc-dom-a"
	mpsDomainB   = "gc-dom-b"
	mpsMemDomain = "gc-mem"
)

// MPSUIDWaitBound bounds how long the uid-1000 client may wait, after the
// root client exits, for its own server: the old server's shutdown and a new
// server's start take seconds (NVIDIA documents no figure; assumed).
const MPSUIDWaitBound = 30 * time.Second

// mpsServer is one MPS server of a daemon: its PID (or, in a mock run, a
// name), its uid and its clients' PIDs.
type mpsServer struct {
	ID      string
	UID     int
	Clients []int
}

func (s mpsServer) String() string {
	return fmt.Sprintf("server %s (uid %d, clients %v)", s.ID, s.UID, s.Clients)
}

// mpsServers asks the daemon of (GPU, domain) for its servers and their
// clients: get_server_list and get_client_list <pid> on a GPU, the
// simulated clients' registry in a mock run.
func (n *node) mpsServers(ctx context.Context, domain string) ([]mpsServer, error) {
	d := n.mpsLife.Daemon(n.gpu.UUID, domain)
	if n.mps == nil {
		byUID := map[int]*mpsServer{}
		var out []mpsServer
		for _, c := range (SimRegistry{Dir: n.simDir()}).Clients() {
			if c.Pipe != d.PipeDir {
				continue
			}
			s, ok := byUID[c.UID]
			if !ok {
				out = append(out, mpsServer{ID: fmt.Sprintf("simulated-%s-uid-%d", domain, c.UID), UID: c.UID})
				s = &out[len(out)-1]
				byUID[c.UID] = s
			}
			s.Clients = append(s.Clients, c.PID)
		}
		return out, nil
	}
	list, err := n.mps.Query(ctx, d, "get_server_list")
	if err != nil {
		return nil, err
	}
	var out []mpsServer
	for _, f := range strings.Fields(list) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		s := mpsServer{ID: f, UID: processUID(pid)}
		clients, err := n.mps.Query(ctx, d, "get_client_list "+f)
		if err != nil {
			return nil, err
		}
		for _, c := range strings.Fields(clients) {
			if p, err := strconv.Atoi(c); err == nil {
				s.Clients = append(s.Clients, p)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// processUID is the real uid of pid (/proc/<pid>/status), -1 if unknown.
func processUID(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				uid, _ := strconv.Atoi(f[0])
				return uid
			}
		}
	}
	return -1
}

// serverOf is the server whose clients include pid.
func serverOf(servers []mpsServer, pid int) (mpsServer, bool) {
	for _, s := range servers {
		if slices.Contains(s.Clients, pid) {
			return s, true
		}
	}
	return mpsServer{}, false
}

// simDir is the mock run's registry of simulated clients.
func (n *node) simDir() string { return n.cfg.WorkDir + "/" + SimRegistryDir }

// hostEnv is the probe environment of a prepared claim, as the backends'
// probes get it (HostProcessEnv: the spec's variables, container paths
// rewritten to host paths for a process outside a container).
func (n *node) hostEnv(p *prepared, i int) ([]string, error) {
	spec, err := Inject(p.cdiIDs(p.shares[i].claim), n.cdiDirs...)
	if err != nil {
		return nil, err
	}
	return HostProcessEnv(spec, os.Environ()).Env, nil
}

// prepareWhole prepares one claim of a whole GPU (100 % of the cores) named
// name in namespace ns with isolation iso, and returns it with its probe
// environment on the host. The caller releases it.
func (n *node) prepareWhole(ctx context.Context, ns, name string, iso configapi.Isolation) (*prepared, []string, error) {
	prep, err := n.prepareShares(ctx, n.claimsFor(ns, name, iso, []int64{100}))
	if err != nil {
		return nil, nil, err
	}
	env, err := n.hostEnv(prep, 0)
	if err != nil {
		prep.release()
		return nil, nil, err
	}
	return prep, env, nil
}

// mpsChecks runs the MPS checks when MPS is checked.
func (n *node) mpsChecks(ctx context.Context) []Check {
	if !slices.Contains(n.cfg.Isolations, configapi.IsolationMPS) {
		return nil
	}
	checks := []Check{
		{Name: "MPS: a root client, then a uid-1000 client (bounded wait)"},
		{Name: "MPS: two trust domains on one GPU (servers time-slice)"},
		{Name: "MPS: memory of a server's context"},
	}
	ep, ok := n.cfg.Prober.(ExecProber)
	reason := n.backendUnavailable(configapi.IsolationMPS)
	if !ok {
		reason = "no probe processes (--no-probes)"
	}
	if reason != "" {
		for i := range checks {
			checks[i].Status, checks[i].Detail = StatusSkipped, reason
		}
		return checks
	}
	checks[0] = n.mpsUIDCheck(ctx, ep, checks[0])
	if n.oneContext != "" {
		// Two domains are two servers: two contexts at once.
		checks[1].Status, checks[1].Detail = StatusSkipped, n.oneContext
	} else {
		checks[1] = n.mpsDomainsCheck(ctx, ep, checks[1])
	}
	checks[2] = n.mpsMemoryCheck(ctx, ep, checks[2])
	return checks
}

// measured is the status of a check that measured (or, in a mock run,
// simulated) without a mismatch.
func (n *node) measured() string {
	if n.cfg.Mock {
		return StatusSimulated
	}
	return StatusMeasured
}

// judged is c with the outcome of a measurement: a mismatch naming bad
// before detail, or with nothing bad, measured (simulated in a mock run)
// with detail.
func (n *node) judged(c Check, bad []string, detail string) Check {
	if len(bad) > 0 {
		c.Status, c.Detail = StatusMismatch, strings.Join(bad, "; ")+" — "+detail
		return c
	}
	c.Status, c.Detail = n.measured(), detail
	return c
}

// asUID makes cmd run as uid and gid. The probe is executed through a
// descriptor this process opened (/proc/self/fd/3 in the child, as
// fexecve does), so that directories the other uid cannot search (a bundle
// under /root) do not stop it.
func asUID(cmd *exec.Cmd, uid, gid int) (func(), error) {
	f, err := os.Open(cmd.Path)
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	cmd.Path = fmt.Sprintf("/proc/self/fd/%d", 2+len(cmd.ExtraFiles))
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	return func() { _ = f.Close() }, nil
}

func (n *node) mpsUIDCheck(ctx context.Context, ep ExecProber, c Check) Check {
	if os.Geteuid() != 0 {
		c.Status, c.Detail = StatusSkipped, fmt.Sprintf("not root (uid %d): starting a client as uid 1000 needs root (setuid)", os.Geteuid())
		return c
	}
	prep, env, err := n.prepareWhole(ctx, mpsUIDDomain, "gpucheck-mps-uid", configapi.IsolationMPS)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	defer prep.release()
	// The second uid must reach the daemon's pipe directory: the check's
	// own directories are made searchable (the daemon's are 1777).
	for _, dir := range []string{n.cfg.WorkDir, n.cfg.WorkDir + "/mps"} {
		_ = os.Chmod(dir, 0o711)
	}

	root, err := ep.start(ctx, env, "hold")
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	defer root.kill()
	if _, err := root.next(ep.timeout(), "holding"); err != nil {
		c.Status, c.Detail = StatusError, "root client: "+err.Error()
		return c
	}
	var bad, facts []string
	servers, err := n.mpsServers(ctx, mpsUIDDomain)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	rootPID := root.cmd.Process.Pid
	if s, ok := serverOf(servers, rootPID); !ok || s.UID != 0 {
		bad = append(bad, fmt.Sprintf("the root client (pid %d) is not a client of a uid-0 server (servers: %v)", rootPID, servers))
	} else {
		facts = append(facts, fmt.Sprintf("root client pid %d went through %s", rootPID, s))
	}

	cmd, err := ep.command(ctx, env, "hold")
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	closeFD, err := asUID(cmd, 1000, 1000)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	defer closeFD()
	other, err := ep.startCmd(cmd)
	if err != nil {
		c.Status, c.Detail = StatusError, "uid-1000 client: "+err.Error()
		return c
	}
	defer other.kill()
	otherPID := other.cmd.Process.Pid
	// The wait is judged from cuInit on: the probe says "loading" right
	// before it, so a slow start is not taken for a wait.
	if _, err := other.next(ep.timeout(), "loading"); err != nil {
		c.Status, c.Detail = StatusError, "uid-1000 client: "+err.Error()
		return c
	}
	// While the root client holds its server, the uid-1000 client waits,
	// and the control daemon lists it as no server's client.
	const early = 3 * time.Second
	if _, err, timedOut := other.await(early, "holding", false); err == nil {
		bad = append(bad, fmt.Sprintf("the uid-1000 client got its context within %s of cuInit while the uid-0 server had a client: legacy MPS makes it wait (docs/mps.md)", early))
	} else if !timedOut {
		c.Status, c.Detail = StatusError, "uid-1000 client: "+err.Error()
		return c
	} else {
		servers, err := n.mpsServers(ctx, mpsUIDDomain)
		if err != nil {
			c.Status, c.Detail = StatusError, err.Error()
			return c
		}
		if s, ok := serverOf(servers, otherPID); ok {
			bad = append(bad, fmt.Sprintf("the uid-1000 client (pid %d) is already a client of %s while the root client holds its server", otherPID, s))
		} else {
			facts = append(facts, fmt.Sprintf("the uid-1000 client waited in cuInit while the root client held the server (%s), and was no server's client (get_client_list; servers: %v)", early, servers))
		}
	}
	released := time.Now()
	if err := root.send("release"); err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	if _, err := root.next(ep.timeout(), "result"); err != nil {
		c.Status, c.Detail = StatusError, "root client: "+err.Error()
		return c
	}
	if len(bad) == 0 {
		m, err := other.next(MPSUIDWaitBound, "holding")
		got := time.Unix(0, m.Time)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("the uid-1000 client had no context %s after the root client was released (bound %s): %v", time.Since(released).Round(time.Millisecond), MPSUIDWaitBound, err))
		case m.Time == 0:
			bad = append(bad, "the uid-1000 client's \"holding\" carries no time: cannot tell whether it came after the release")
		case !got.After(released):
			bad = append(bad, fmt.Sprintf("the uid-1000 client got its context %s before the root client was released: it did not wait", released.Sub(got).Round(time.Millisecond)))
		case got.Sub(released) > MPSUIDWaitBound:
			bad = append(bad, fmt.Sprintf("the uid-1000 client got its context %s after the root client was released (bound %s)", got.Sub(released).Round(time.Millisecond), MPSUIDWaitBound))
		default:
			facts = append(facts, fmt.Sprintf("it got its context %s after the root client was released (bound %s)", got.Sub(released).Round(time.Millisecond), MPSUIDWaitBound))
		}
	}
	if len(bad) == 0 {
		servers, err := n.mpsServers(ctx, mpsUIDDomain)
		if err != nil {
			c.Status, c.Detail = StatusError, err.Error()
			return c
		}
		if s, ok := serverOf(servers, otherPID); !ok || s.UID != 1000 {
			bad = append(bad, fmt.Sprintf("the uid-1000 client (pid %d) is not a client of a uid-1000 server (servers: %v)", otherPID, servers))
		} else {
			facts = append(facts, fmt.Sprintf("uid-1000 client pid %d went through %s", otherPID, s))
		}
	}
	_ = other.send("release")
	_, _ = other.next(ep.timeout(), "result")
	if len(bad) > 0 {
		c.Status, c.Detail = StatusMismatch, strings.Join(append(bad, facts...), "; ")
		return c
	}
	c.Status, c.Detail = n.measured(), strings.Join(facts, "; ")
	return c
}

// workPhase runs one work probe per env together for d and returns their
// rates (loop iterations per second); servers, when asked, are each
// domain's servers while the probes held their contexts.
func (n *node) workPhase(ctx context.Context, ep ExecProber, envs [][]string, d time.Duration, domains []string) ([]float64, []int, map[string][]mpsServer, error) {
	procs, err := ep.startAll(ctx, envs, "work", "--seconds", fmt.Sprint(d.Seconds()))
	if err != nil {
		return nil, nil, nil, err
	}
	defer killProbes(procs)
	pids := make([]int, len(procs))
	for i, p := range procs {
		if _, err := p.next(ep.timeout(), "ready"); err != nil {
			return nil, nil, nil, fmt.Errorf("work probe %d: %w", i, err)
		}
		pids[i] = p.cmd.Process.Pid
	}
	servers := map[string][]mpsServer{}
	for _, dom := range domains {
		s, err := n.mpsServers(ctx, dom)
		if err != nil {
			return nil, nil, nil, err
		}
		servers[dom] = s
	}
	for _, p := range procs {
		if err := p.send("go"); err != nil {
			return nil, nil, nil, err
		}
	}
	rates := make([]float64, len(procs))
	for i, p := range procs {
		m, err := p.next(d+ep.timeout(), "result")
		if err != nil {
			return nil, nil, nil, fmt.Errorf("work probe %d: %w", i, err)
		}
		if m.Compute == nil {
			return nil, nil, nil, fmt.Errorf("work probe %d: a result without figures", i)
		}
		rates[i] = m.Compute.WorkRate()
	}
	return rates, pids, servers, nil
}

// Time-slicing verdict: a client whose rate beside another context's falls
// to within [sliceLow, sliceHigh] of its rate alone was time-sliced; one
// that keeps at least sideBySide ran side by side.
const (
	sliceLow   = 0.30
	sliceHigh  = 0.70
	sideBySide = 0.75
)

func (n *node) mpsDomainsCheck(ctx context.Context, ep ExecProber, c Check) Check {
	d := min(n.cfg.ComputeTime, 5*time.Second)
	if d <= 0 {
		d = 5 * time.Second
	}
	// Three shares of 30 % (the work kernel uses a quarter of the SMs, so
	// a 30 % thread limit does not slow it).
	shares := append(n.claimsFor(mpsDomainA, "gpucheck-mps-dom-a", configapi.IsolationMPS, []int64{30, 30}),
		n.claimsFor(mpsDomainB, "gpucheck-mps-dom-b", configapi.IsolationMPS, []int64{30})...)
	prep, err := n.prepareShares(ctx, shares)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	defer prep.release()
	envs := make([][]string, len(shares))
	for i := range shares {
		if envs[i], err = n.hostEnv(prep, i); err != nil {
			c.Status, c.Detail = StatusError, err.Error()
			return c
		}
	}
	a1, a2, b := envs[0], envs[1], envs[2]
	fail := func(phase string, err error) Check {
		c.Status, c.Detail = StatusError, phase+": "+err.Error()
		return c
	}
	aAlone, _, _, err := n.workPhase(ctx, ep, [][]string{a1}, d, nil)
	if err != nil {
		return fail("domain A alone", err)
	}
	bAlone, _, _, err := n.workPhase(ctx, ep, [][]string{b}, d, nil)
	if err != nil {
		return fail("domain B alone", err)
	}
	cross, pids, servers, err := n.workPhase(ctx, ep, [][]string{a1, b}, d, []string{mpsDomainA, mpsDomainB})
	if err != nil {
		return fail("domains A and B together", err)
	}
	same, _, _, err := n.workPhase(ctx, ep, [][]string{a1, a2}, d, nil)
	if err != nil {
		return fail("two clients of domain A together", err)
	}
	if aAlone[0] <= 0 || bAlone[0] <= 0 {
		c.Status, c.Detail = StatusError, fmt.Sprintf("a client alone did no work (rates %.3g, %.3g)", aAlone[0], bAlone[0])
		return c
	}
	rA, rB := cross[0]/aAlone[0], cross[1]/bAlone[0]
	s1, s2 := same[0]/aAlone[0], same[1]/aAlone[0]
	var bad []string
	sa, okA := serverOf(servers[mpsDomainA], pids[0])
	sb, okB := serverOf(servers[mpsDomainB], pids[1])
	if !okA || !okB || sa.ID == sb.ID && !n.cfg.Mock {
		bad = append(bad, fmt.Sprintf("the two domains' clients (pids %d, %d) are not each a client of its own domain's server (A: %v, B: %v)", pids[0], pids[1], servers[mpsDomainA], servers[mpsDomainB]))
	}
	timeSliced := inRange(rA, sliceLow, sliceHigh) && inRange(rB, sliceLow, sliceHigh)
	sideBy := s1 >= sideBySide && s2 >= sideBySide
	if !timeSliced {
		bad = append(bad, fmt.Sprintf("two domains' clients together kept %.0f %% and %.0f %% of their rates alone: not time-sliced (docs/mps.md: servers of different daemons time-slice; want each within %.0f–%.0f %%)", rA*100, rB*100, sliceLow*100, sliceHigh*100))
	}
	if !sideBy {
		bad = append(bad, fmt.Sprintf("two clients of one domain together kept %.0f %% and %.0f %%: not side by side on their one server (want at least %.0f %%)", s1*100, s2*100, sideBySide*100))
	}
	detail := fmt.Sprintf("fixed-work kernel on a quarter of the SMs, %s per phase; alone: domain A %.4g, domain B %.4g iterations/s; A and B together (servers %s and %s): %.0f %% and %.0f %% of alone; two clients of A together (one server): %.0f %% and %.0f %%",
		d, aAlone[0], bAlone[0], sa.ID, sb.ID, rA*100, rB*100, s1*100, s2*100)
	if len(bad) > 0 {
		c.Status, c.Detail = StatusMismatch, strings.Join(bad, "; ")+" — "+detail
		return c
	}
	c.Status, c.Detail = n.measured(), "servers of two domains time-slice (each about half), clients of one server run side by side — "+detail
	return c
}

func inRange(v, lo, hi float64) bool { return v >= lo && v <= hi && !math.IsNaN(v) }

// usedMemory is NVML's used memory of the checked GPU.
func (n *node) usedMemory() (uint64, error) {
	dev, ret := n.cfg.NVML.DeviceGetHandleByUUID(n.gpu.UUID)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("nvmlDeviceGetHandleByUUID: %w", ret)
	}
	m, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("nvmlDeviceGetMemoryInfo: %w", ret)
	}
	return m.Used, nil
}

// settle waits for NVML's used memory to stop changing (the driver frees a
// context's memory shortly after its process exits), at most limit.
func (n *node) settle(limit time.Duration) (uint64, error) {
	prev, err := n.usedMemory()
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		cur, err := n.usedMemory()
		if err != nil {
			return 0, err
		}
		if cur == prev {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

func mibOf(b int64) string { return fmt.Sprintf("%.0f MiB (%d bytes)", float64(b)/mib, b) }

func (n *node) mpsMemoryCheck(ctx context.Context, ep ExecProber, c Check) Check {
	before, err := n.settle(5 * time.Second)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	prep, env, err := n.prepareWhole(ctx, mpsMemDomain, "gpucheck-mps-mem", configapi.IsolationMPS)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	defer prep.release()
	daemonOnly, err := n.settle(5 * time.Second)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	var clients []*probeProcess
	defer func() { killProbes(clients) }()
	used := []uint64{daemonOnly}
	for i := range 2 {
		p, err := ep.start(ctx, env, "hold")
		if err != nil {
			c.Status, c.Detail = StatusError, err.Error()
			return c
		}
		clients = append(clients, p)
		if _, err := p.next(ep.timeout(), "holding"); err != nil {
			c.Status, c.Detail = StatusError, fmt.Sprintf("client %d: %v", i+1, err)
			return c
		}
		u, err := n.settle(5 * time.Second)
		if err != nil {
			c.Status, c.Detail = StatusError, err.Error()
			return c
		}
		used = append(used, u)
	}
	servers, err := n.mpsServers(ctx, mpsMemDomain)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	perProcess := n.processMemory()
	for _, p := range clients {
		_ = p.send("release")
		_, _ = p.next(ep.timeout(), "result")
	}
	after, err := n.settle(5 * time.Second)
	if err != nil {
		c.Status, c.Detail = StatusError, err.Error()
		return c
	}
	serversAfter, _ := n.mpsServers(ctx, mpsMemDomain)

	client1 := int64(used[1]) - int64(used[0])
	client2 := int64(used[2]) - int64(used[1])
	detail := []string{
		fmt.Sprintf("NVML used memory: %s before the daemon, %s with the daemon (no server yet), %s with one client, %s with two, %s after both exited",
			mibOf(int64(before)), mibOf(int64(daemonOnly)), mibOf(int64(used[1])), mibOf(int64(used[2])), mibOf(int64(after))),
		fmt.Sprintf("the first client added %s (its server's context and its own), the second %s (a client's own)", mibOf(client1), mibOf(client2)),
	}
	server := client1 - client2
	how := "first client less second"
	if len(serversAfter) > 0 && n.mps != nil {
		// The server outlived its clients: what it holds alone is its
		// context.
		server, how = int64(after)-int64(daemonOnly), "after the clients exited, the server still running"
	}
	detail = append(detail, fmt.Sprintf("a server's context: %s (%s); servers while the clients held: %v; NVML per process: %s", mibOf(server), how, servers, perProcess))
	if n.cfg.Mock {
		detail = append(detail, fmt.Sprintf("mock: the mock NVML counts each simulated client as a %d MiB process and, while a (pipe directory, uid) has clients, a simulated server of %d MiB", SimulatedContextMiB, SimulatedServerMiB))
	}
	pids := [2]int{clients[0].cmd.Process.Pid, clients[1].cmd.Process.Pid}
	bad := judgeMPSMemory(servers, pids, server, client2, int64(isolation.DefaultMPSServerReserve))
	return n.judged(c, bad, strings.Join(detail, "; "))
}

// mpsServerFloor is the least a server's context can take: a figure below
// it means no server context was measured (clients that did not go
// through MPS, each with a context of its own, show the same increase
// twice). 32 MiB is far below any CUDA context (docs/mps.md expects about
// 0.5 GiB on an H100); assumed, not measured.
const mpsServerFloor = 32 << 20

// judgeMPSMemory is the memory check's verdict: both clients (pids) must be
// clients of the domain's one server, the server's context (server bytes)
// above mpsServerFloor and at most reserve (what every MPS share leaves out
// for it), and the second client's increase (client2 bytes) not negative.
// It returns what is wrong; none: the figure stands.
func judgeMPSMemory(servers []mpsServer, pids [2]int, server, client2, reserve int64) []string {
	var bad []string
	s1, ok1 := serverOf(servers, pids[0])
	s2, ok2 := serverOf(servers, pids[1])
	switch {
	case len(servers) != 1:
		bad = append(bad, fmt.Sprintf("the domain's daemon lists %d servers while its two clients held (want exactly one: %v): the figure is not one server's context", len(servers), servers))
	case !ok1 || !ok2 || s1.ID != s2.ID:
		bad = append(bad, fmt.Sprintf("the clients (pids %d, %d) are not both clients of the domain's server (%v): they did not go through it", pids[0], pids[1], servers))
	}
	if server <= mpsServerFloor {
		bad = append(bad, fmt.Sprintf("a server's context of %s is not above %s: no server context was measured", mibOf(server), mibOf(mpsServerFloor)))
	}
	if client2 < 0 {
		bad = append(bad, fmt.Sprintf("the second client lowered the GPU's used memory (%s): the readings moved for another reason", mibOf(client2)))
	}
	if server > reserve {
		bad = append(bad, fmt.Sprintf("a server's context (%s) is larger than the %s that pkg/isolation's DefaultMPSServerReserve leaves out of each MPS share", mibOf(server), mibOf(reserve)))
	}
	return bad
}

// processMemory lists the checked GPU's compute and MPS-client processes
// with NVML's memory for each ("n/a": NVML_VALUE_NOT_AVAILABLE, as for MPS
// clients).
func (n *node) processMemory() string {
	dev, ret := n.cfg.NVML.DeviceGetHandleByUUID(n.gpu.UUID)
	if ret != nvml.SUCCESS {
		return ret.Error()
	}
	var parts []string
	list := func(kind string, f func() ([]nvml.ProcessInfo, nvml.Return)) {
		procs, ret := f()
		if ret != nvml.SUCCESS {
			parts = append(parts, fmt.Sprintf("%s: %v", kind, ret))
			return
		}
		for _, p := range procs {
			m := "n/a"
			if p.UsedGpuMemory != nvmlValueNotAvailable {
				m = fmt.Sprintf("%d MiB", p.UsedGpuMemory>>20)
			}
			parts = append(parts, fmt.Sprintf("%s pid %d %s", kind, p.Pid, m))
		}
	}
	list("compute", dev.GetComputeRunningProcesses)
	if ext := n.cfg.NVML.Extensions(); ext == nil || ext.LookupSymbol("nvmlDeviceGetMPSComputeRunningProcesses") == nil {
		list("MPS client", dev.GetMPSComputeRunningProcesses)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
