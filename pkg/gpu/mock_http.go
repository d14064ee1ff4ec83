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
//	/mock/xid?gpu=<index>&xid=<code>      a critical XID error
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
	handle("/mock/xid", func(i int, r *http.Request) (string, error) {
		xid, err := strconv.ParseUint(r.URL.Query().Get("xid"), 10, 64)
		if err != nil {
			return "", fmt.Errorf("xid=%q: want an XID code", r.URL.Query().Get("xid"))
		}
		sets, err := n.InjectXID(i, xid)
		return fmt.Sprintf("XID %d on GPU %d delivered to %d event sets", xid, i, sets), err
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
