package gpu

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVLinkPeers is what one GPU reports about its NVLinks. It is the input of
// NVLinkDomains and holds no NVML handles, so the reduction stays a pure function.
type NVLinkPeers struct {
	// UUID of the GPU.
	UUID string
	// PCIBusID of the GPU in the canonical form (see GPU.PCIBusID).
	PCIBusID string
	// Remotes are the canonical PCI bus ids at the far end of the GPU's enabled
	// links, except links NVML already identified as ending at an NVSwitch.
	// Repeats (several links to the same peer) are fine.
	Remotes []string
	// Switch is true when at least one enabled link ends at an NVSwitch.
	Switch bool
	// Fabric is "<cluster uuid>/<clique id>" when the GPU completed its
	// registration with the NVLink fabric (nvmlDeviceGetGpuFabricInfo), else "".
	Fabric string
	// Unknown is true when the GPU's links or fabric registration could not
	// be read: the GPU is a domain of its own, and the links of other GPUs
	// that end at it join nothing (they are not taken for NVSwitch links
	// either). Its Remotes, Switch and Fabric are ignored.
	Unknown bool
}

// NVLinkDomains reduces the NVLink graph of one node to connected components and
// returns the domain id of every GPU, keyed by UUID.
//
// Two GPUs are in one domain when any of these holds, transitively:
//   - an enabled link of one ends at the other's PCI bus id;
//   - both registered with the NVLink fabric in the same cluster and clique;
//   - neither registered with the fabric and both have a link that ends at an
//     NVSwitch. A link ends at an NVSwitch when NVML says so, or when its remote
//     PCI bus id belongs to none of the node's GPUs: in a single node the only
//     NVLink peers that are not GPUs are NVSwitches. All NVSwitches of a node are
//     taken to be one switch fabric, which holds for HGX/DGX baseboards.
//
// A fabric registration is authoritative: a registered GPU joins other GPUs
// through its clique and its direct GPU links, never through the NVSwitch rule,
// because NVLink partitions on multi-node (NVL) systems split GPUs that share
// switches into cliques that cannot reach each other.
//
// The result depends only on the set of inputs, not their order, and the ids are
// stable across restarts: a domain that contains registered GPUs is named after
// its (smallest) fabric cluster/clique, so GPUs of one clique on different nodes
// share the id; any other domain is named after its sorted member UUIDs. A GPU
// without NVLink, or whose links are Unknown, is a domain of its own. Ids look
// like "nvl-1a2b3c4d".
//
// A node-local domain id changes when its membership changes, for example when a
// GPU falls off the bus; the id names the set of GPUs that can talk over NVLink,
// so that is intended.
func NVLinkDomains(gpus []NVLinkPeers) map[string]string {
	// Work on a copy sorted by UUID so that nothing below depends on input order.
	peers := slices.Clone(gpus)
	slices.SortFunc(peers, func(a, b NVLinkPeers) int { return strings.Compare(a.UUID, b.UUID) })

	byBus := make(map[string]int, len(peers))
	for i, p := range peers {
		byBus[p.PCIBusID] = i
	}

	u := newUnionFind(len(peers))
	switchGroup := -1
	fabricGroup := map[string]int{}
	for i, p := range peers {
		if p.Unknown {
			// What it reports cannot be trusted; claiming a peer it may not
			// reach would let a matchAttribute constraint place a job
			// across GPUs that cannot talk over NVLink.
			continue
		}
		reachesSwitch := p.Switch
		for _, remote := range p.Remotes {
			if j, ok := byBus[remote]; ok {
				if !peers[j].Unknown {
					u.union(i, j)
				}
			} else {
				reachesSwitch = true
			}
		}
		switch {
		case p.Fabric != "":
			if j, ok := fabricGroup[p.Fabric]; ok {
				u.union(i, j)
			} else {
				fabricGroup[p.Fabric] = i
			}
		case reachesSwitch:
			if switchGroup >= 0 {
				u.union(i, switchGroup)
			} else {
				switchGroup = i
			}
		}
	}

	type component struct {
		uuids  []string
		fabric string // smallest fabric key among the members, "" if none
	}
	components := map[int]*component{}
	for i, p := range peers {
		root := u.find(i)
		c := components[root]
		if c == nil {
			c = &component{}
			components[root] = c
		}
		c.uuids = append(c.uuids, p.UUID) // peers is sorted, so uuids is too
		if !p.Unknown && p.Fabric != "" && (c.fabric == "" || p.Fabric < c.fabric) {
			c.fabric = p.Fabric
		}
	}

	domains := make(map[string]string, len(peers))
	for _, c := range components {
		key := "gpus:" + strings.Join(c.uuids, ",")
		if c.fabric != "" {
			key = "fabric:" + c.fabric
		}
		id := domainID(key)
		for _, uuid := range c.uuids {
			domains[uuid] = id
		}
	}
	return domains
}

// domainID derives the short, stable domain id from a component's key.
func domainID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "nvl-" + hex.EncodeToString(sum[:4])
}

// fabricKey returns the NVLinkPeers.Fabric value for a fabric registration, or ""
// when the GPU is not (or not yet successfully) registered. An all-zero cluster
// UUID is treated as "not registered" so that unrelated nodes never share a domain.
func fabricKey(info nvml.GpuFabricInfo) string {
	if info.State != nvml.GPU_FABRIC_STATE_COMPLETED || nvml.Return(info.Status) != nvml.SUCCESS {
		return ""
	}
	if info.ClusterUuid == [16]uint8{} {
		return ""
	}
	u := info.ClusterUuid
	return fmt.Sprintf("%x-%x-%x-%x-%x/%d", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16], info.CliqueId)
}

// unionFind is a disjoint-set forest over 0..n-1.
type unionFind []int

func newUnionFind(n int) unionFind {
	u := make(unionFind, n)
	for i := range u {
		u[i] = i
	}
	return u
}

func (u unionFind) find(i int) int {
	for u[i] != i {
		u[i] = u[u[i]]
		i = u[i]
	}
	return i
}

func (u unionFind) union(i, j int) {
	ri, rj := u.find(i), u.find(j)
	if ri == rj {
		return
	}
	// Keep the smaller index as root; any rule would do, this one is deterministic.
	if rj < ri {
		ri, rj = rj, ri
	}
	u[rj] = ri
}

// probeNVLink asks NVML about the links of one GPU. Links that do not exist
// on the GPU and facts the driver does not support are skipped; any other
// NVML failure is returned, naming the call and the link.
func probeNVLink(dev nvml.Device, sym symbols, uuid, busID string) (NVLinkPeers, error) {
	peers := NVLinkPeers{UUID: uuid, PCIBusID: busID}
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		state, ret := dev.GetNvLinkState(link)
		if absent(ret) {
			continue // the GPU has fewer links, or no NVLink at all
		}
		if ret != nvml.SUCCESS {
			return peers, nvmlError(fmt.Sprintf("nvmlDeviceGetNvLinkState(link %d)", link), ret)
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		if sym.nvlinkRemoteType {
			kind, ret := dev.GetNvLinkRemoteDeviceType(link)
			switch {
			case ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH:
				// The remote PCI info of a switch link is not needed (and on
				// multi-node systems not meaningful).
				peers.Switch = true
				continue
			case ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_IBMNPU:
				continue // a CPU, not a peer GPU
			case ret != nvml.SUCCESS && !absent(ret):
				return peers, nvmlError(fmt.Sprintf("nvmlDeviceGetNvLinkRemoteDeviceType(link %d)", link), ret)
			}
		}
		pci, ret := dev.GetNvLinkRemotePciInfo(link)
		if absent(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return peers, nvmlError(fmt.Sprintf("nvmlDeviceGetNvLinkRemotePciInfo(link %d)", link), ret)
		}
		remote, err := pciBusID(pci)
		if err != nil {
			return peers, fmt.Errorf("nvmlDeviceGetNvLinkRemotePciInfo(link %d): %w", link, err)
		}
		peers.Remotes = append(peers.Remotes, remote)
	}
	return peers, nil
}

// fabricRegistration is what nvmlDeviceGetGpuFabricInfo says about one GPU.
type fabricRegistration struct {
	// key is NVLinkPeers.Fabric (see fabricKey).
	key   string
	state FabricState
	// err is NVML's error of a registration completed without success.
	err string
}

// probeFabric reads the GPU's NVLink fabric registration. A driver without
// the call, and a GPU that answers NOT_SUPPORTED (no NVSwitch, pre-Hopper),
// take no part in a fabric (FabricNone); any other NVML failure is returned.
func probeFabric(dev nvml.Device, sym symbols) (fabricRegistration, error) {
	if !sym.fabricInfo {
		return fabricRegistration{}, nil
	}
	info, ret := dev.GetGpuFabricInfo()
	switch {
	case absent(ret):
		return fabricRegistration{}, nil
	case ret != nvml.SUCCESS:
		return fabricRegistration{}, nvmlError("nvmlDeviceGetGpuFabricInfo", ret)
	}
	r := fabricRegistration{key: fabricKey(info)}
	switch info.State {
	case nvml.GPU_FABRIC_STATE_NOT_STARTED:
		r.state = FabricNotStarted
	case nvml.GPU_FABRIC_STATE_IN_PROGRESS:
		r.state = FabricInProgress
	case nvml.GPU_FABRIC_STATE_COMPLETED:
		// NVML documents Status as valid only once the state is COMPLETED.
		r.state = FabricCompleted
		if status := nvml.Return(info.Status); status != nvml.SUCCESS {
			r.state, r.err = FabricFailed, status.Error()
		}
	default:
		// GPU_FABRIC_STATE_NOT_SUPPORTED, or a state newer than go-nvml:
		// the GPU is not (known to be) in a fabric.
		r.state = FabricNone
	}
	return r, nil
}
