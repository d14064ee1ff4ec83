package gpu

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
)

// FaultHandler is an HTTP test knob over the node's event injection, for
// end-to-end tests of a running plugin with a mock profile. It must never be
// served on a real node. Requests (POST, query parameters):
//
//	/mock/xid?gpu=<index>&xid=<code>[&gi=<id>[&ci=<id>]]
//	                                      a critical XID error; with gi (and
//	                                      ci) attributed to that MIG GPU
//	                                      (compute) instance (InjectMIGXID)
//	/mock/dbe?gpu=<index>                 a double-bit ECC error
//	/mock/lost?gpu=<index>&lost=true|false the GPU falls off the bus / returns
//	/mock/discovery?gpu=<index>&fail=true|false[&call=<nvml call>]
//	                                      the GPU fails discovery (ERROR_UNKNOWN
//	                                      from call, default nvmlDeviceGetMemoryInfo;
//	                                      see FailDiscovery) from the next
//	                                      rediscovery on / describes again
//	/mock/process?gpu=<index>&pid=<pid>[&pod=<uid>][&sm=<percent>][&memory=<bytes>][&remove=true]
//	                                      a compute process of a pod on the GPU
//	                                      (see SetProcessActivity)
//	/mock/mig?gpu=<index>&pending=true|false
//	                                      the admin changes the MIG mode; it
//	                                      takes effect at /mock/mig-reset
//	                                      (SetMIGPending)
//	/mock/mig?gpu=<index>&enabled=true|false
//	                                      the MIG mode as after a reset (SetMIG)
//	/mock/mig-reset?gpu=<index>           reset the GPU (ResetGPU)
//	/mock/mig-create?gpu=<index>&profile=<name>[&start=<slice>]
//	                                      an admin's GPU instance with its
//	                                      compute instance (CreateMIGInstance)
//	/mock/mig-destroy?gpu=<index>&gi=<id> destroy it (DestroyMIGInstance)
//	/mock/mig-process?gpu=<index>&gi=<id>&ci=<id>[&pid=<pid>[&memory=<bytes>]]
//	                                      the MIG device's processes: one, or
//	                                      none without pid (SetMIGProcesses)
//
// The answer says how many event sets received the event.
func (n *MockNode) FaultHandler() http.Handler {
	mux := http.NewServeMux()
	gpuIndex := func(r *http.Request) (int, error) {
		i, err := strconv.Atoi(r.URL.Query().Get("gpu"))
		if err != nil {
			return 0, fmt.Errorf("gpu=%q: want a GPU index", r.URL.Query().Get("gpu"))
		}
		return i, nil
	}
	handle := func(path string, do func(i int, r *http.Request) (string, error)) {
		mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
			i, err := gpuIndex(r)
			if err == nil {
				var msg string
				if msg, err = do(i, r); err == nil {
					fmt.Fprintln(w, msg)
					return
				}
			}
			http.Error(w, err.Error(), http.StatusBadRequest)
		})
	}
	// id reads an optional non-negative integer parameter; def when absent.
	id := func(r *http.Request, name string, def int) (int, error) {
		v := r.URL.Query().Get(name)
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s=%q: want a non-negative number", name, v)
		}
		return n, nil
	}
	// instance reads the optional gi and ci parameters; -1 when absent.
	instance := func(r *http.Request) (gi, ci int, err error) {
		if gi, err = id(r, "gi", -1); err != nil {
			return 0, 0, err
		}
		ci, err = id(r, "ci", -1)
		return gi, ci, err
	}
	handle("/mock/xid", func(i int, r *http.Request) (string, error) {
		xid, err := strconv.ParseUint(r.URL.Query().Get("xid"), 10, 64)
		if err != nil {
			return "", fmt.Errorf("xid=%q: want an XID code", r.URL.Query().Get("xid"))
		}
		gi, ci, err := instance(r)
		if err != nil {
			return "", err
		}
		if gi >= 0 {
			sets, err := n.InjectMIGXID(i, gi, ci, xid)
			return fmt.Sprintf("XID %d on GPU %d GPU instance %d compute instance %d delivered to %d event sets", xid, i, gi, ci, sets), err
		}
		if ci >= 0 {
			return "", fmt.Errorf("ci=%d without gi", ci)
		}
		sets, err := n.InjectXID(i, xid)
		return fmt.Sprintf("XID %d on GPU %d delivered to %d event sets", xid, i, sets), err
	})
	handle("/mock/mig", func(i int, r *http.Request) (string, error) {
		q := r.URL.Query()
		if q.Get("pending") != "" && q.Get("enabled") != "" {
			return "", fmt.Errorf("want pending or enabled, not both")
		}
		for _, knob := range []struct {
			name string
			set  func(int, bool) error
		}{{"pending", n.SetMIGPending}, {"enabled", n.SetMIG}} {
			name, set := knob.name, knob.set
			if q.Get(name) == "" {
				continue
			}
			v, err := strconv.ParseBool(q.Get(name))
			if err != nil {
				return "", fmt.Errorf("%s=%q: want true or false", name, q.Get(name))
			}
			return fmt.Sprintf("GPU %d MIG mode %s=%v", i, name, v), set(i, v)
		}
		return "", fmt.Errorf("want pending=true|false or enabled=true|false")
	})
	handle("/mock/mig-reset", func(i int, _ *http.Request) (string, error) {
		return fmt.Sprintf("GPU %d reset", i), n.ResetGPU(i)
	})
	handle("/mock/mig-create", func(i int, r *http.Request) (string, error) {
		start, err := id(r, "start", -1)
		if err != nil {
			return "", err
		}
		profile := r.URL.Query().Get("profile")
		gi, ci, err := n.CreateMIGInstance(i, profile, start)
		return fmt.Sprintf("GPU %d: %s created as GPU instance %d compute instance %d", i, profile, gi, ci), err
	})
	handle("/mock/mig-destroy", func(i int, r *http.Request) (string, error) {
		gi, err := id(r, "gi", -1)
		if err != nil || gi < 0 {
			return "", fmt.Errorf("gi=%q: want a GPU instance ID", r.URL.Query().Get("gi"))
		}
		return fmt.Sprintf("GPU %d: GPU instance %d destroyed", i, gi), n.DestroyMIGInstance(i, gi)
	})
	handle("/mock/mig-process", func(i int, r *http.Request) (string, error) {
		gi, ci, err := instance(r)
		if err != nil {
			return "", err
		}
		if gi < 0 || ci < 0 {
			return "", fmt.Errorf("want gi and ci")
		}
		var procs []nvml.ProcessInfo
		if pid := r.URL.Query().Get("pid"); pid != "" {
			p, err := strconv.ParseUint(pid, 10, 32)
			if err != nil || p == 0 {
				return "", fmt.Errorf("pid=%q: want a process id", pid)
			}
			var memory uint64
			if m := r.URL.Query().Get("memory"); m != "" {
				if memory, err = strconv.ParseUint(m, 10, 64); err != nil {
					return "", fmt.Errorf("memory=%q: want a number of bytes", m)
				}
			}
			procs = []nvml.ProcessInfo{{Pid: uint32(p), UsedGpuMemory: memory}}
		}
		return fmt.Sprintf("GPU %d MIG device %d/%d: %d processes", i, gi, ci, len(procs)), n.SetMIGProcesses(i, gi, ci, procs)
	})
	handle("/mock/dbe", func(i int, _ *http.Request) (string, error) {
		sets, err := n.InjectEvent(i, nvml.EventTypeDoubleBitEccError, 0)
		return fmt.Sprintf("double-bit ECC error on GPU %d delivered to %d event sets", i, sets), err
	})
	handle("/mock/lost", func(i int, r *http.Request) (string, error) {
		lost, err := strconv.ParseBool(r.URL.Query().Get("lost"))
		if err != nil {
			return "", fmt.Errorf("lost=%q: want true or false", r.URL.Query().Get("lost"))
		}
		return fmt.Sprintf("GPU %d lost=%v", i, lost), n.SetLost(i, lost)
	})
	handle("/mock/discovery", func(i int, r *http.Request) (string, error) {
		fail, err := strconv.ParseBool(r.URL.Query().Get("fail"))
		if err != nil {
			return "", fmt.Errorf("fail=%q: want true or false", r.URL.Query().Get("fail"))
		}
		call := r.URL.Query().Get("call")
		if call == "" {
			call = DefaultMockDiscoveryCall
		}
		ret := nvml.SUCCESS
		if fail {
			ret = nvml.ERROR_UNKNOWN
		}
		return fmt.Sprintf("GPU %d fails discovery (%s)=%v", i, call, fail), n.FailDiscovery(i, call, ret)
	})
	handle("/mock/process", func(i int, r *http.Request) (string, error) {
		q := r.URL.Query()
		pid, err := strconv.ParseUint(q.Get("pid"), 10, 32)
		if err != nil || pid == 0 {
			return "", fmt.Errorf("pid=%q: want a process id", q.Get("pid"))
		}
		num := func(name string, bits int) (uint64, error) {
			if q.Get(name) == "" {
				return 0, nil
			}
			v, err := strconv.ParseUint(q.Get(name), 10, bits)
			if err != nil {
				return 0, fmt.Errorf("%s=%q: want a number", name, q.Get(name))
			}
			return v, nil
		}
		sm, err := num("sm", 32)
		if err != nil {
			return "", err
		}
		memory, err := num("memory", 64)
		if err != nil {
			return "", err
		}
		remove := q.Get("remove") == "true"
		pod := types.UID(q.Get("pod"))
		if err := n.SetProcessActivity(i, uint32(pid), pod, uint32(sm), memory, remove); err != nil {
			return "", err
		}
		if remove {
			return fmt.Sprintf("process %d removed from GPU %d", pid, i), nil
		}
		return fmt.Sprintf("process %d of pod %q on GPU %d: SM %d%%, %d bytes", pid, pod, i, sm, memory), nil
	})
	return mux
}
