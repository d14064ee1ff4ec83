package metrics

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/pkg/checkpoint"
	"github.com/tessera-dev/tessera/pkg/gpu"
	"github.com/tessera-dev/tessera/pkg/model"
)

// MIGDevice is one MIG device of a GPU in MIG mode (docs/mig.md): a static
// compute instance, or a dynamic placement a prepared claim holds.
type MIGDevice struct {
	// Minor and GPUUUID are the parent GPU's.
	Minor   int
	GPUUUID string
	// Device is gpu-N-mig-<GI>-<CI> or gpu-N-mig-<profile>-<start>.
	Device  string
	Profile string
	// PlacementStart and PlacementSize are the memory slices it covers.
	PlacementStart, PlacementSize int
	// UUID is the MIG device's "MIG-…" UUID; empty while a dynamic
	// instance does not exist yet.
	UUID string
	// MemoryBytes and Cores (percent of the GPU's compute slices) are what
	// it has, and what a claim that holds it holds of the GPU.
	MemoryBytes int64
	Cores       int64
	Dynamic     bool
	// Healthy is false while the device is tainted; Taint is the effect
	// then.
	Healthy bool
	Taint   string
	// Holders are the prepared claims that hold it.
	Holders []MIGHolder
}

// MIGHolder is a prepared claim's allocation result on a MIG device.
type MIGHolder struct {
	UID       types.UID
	Namespace string
	Name      string
	Pods      []string
	Request   string
	// AdminAccess devices observe; they hold nothing.
	AdminAccess bool
	Isolation   string
}

// MIGDevices lists the MIG devices of gpus for a Snapshot: every compute
// instance of a static-MIG GPU, and the placements of a dynamic-MIG GPU
// (dynamic says which, nil: none) that a claim holds, each with the
// completed claims of the checkpoint that hold it (pods by claim UID, as
// far as known) and its health (unhealthy: the taint effect by device name,
// from the health tracker). The kubelet plugin's MetricsSnapshot sets
// Snapshot.MIG to it.
func MIGDevices(gpus []gpu.GPU, dynamic func(gpu.GPU) bool, claims []checkpoint.Claim, pods map[types.UID][]string, unhealthy map[string]string) []MIGDevice {
	type key struct {
		minor  int
		device string
	}
	byKey := map[key]*MIGDevice{}
	var order []key
	add := func(d MIGDevice) *MIGDevice {
		k := key{d.Minor, d.Device}
		if have, ok := byKey[k]; ok {
			return have
		}
		if effect, bad := unhealthy[d.Device]; bad {
			d.Healthy, d.Taint = false, effect
		} else {
			d.Healthy = true
		}
		byKey[k] = &d
		order = append(order, k)
		return byKey[k]
	}
	migGPUs := map[int]gpu.GPU{}
	for _, g := range gpus {
		if !g.MIGEnabled || g.MIG == nil {
			continue
		}
		migGPUs[g.Minor] = g
		dyn := dynamic != nil && dynamic(g)
		if dyn {
			continue // its placements are listed when a claim holds one
		}
		// One device per GPU instance (model.MIGStaticDeviceName): its
		// compute instances share its memory and engines.
		for _, gi := range g.MIG.Instances {
			if len(gi.ComputeInstances) == 0 {
				continue
			}
			p, _ := g.MIG.Profile(gi.ProfileID)
			name := gi.ProfileName
			if name == "" {
				name = p.Name
			}
			memory, slicesOf := p.MemoryBytes, 0
			for _, ci := range gi.ComputeInstances {
				memory = max(memory, ci.MemoryBytes)
				// A compute instance with part of the GPU instance's SMs
				// has that share of its compute slices (as the model
				// publishes it).
				if ci.Multiprocessors > 0 && p.Multiprocessors > 0 && ci.Multiprocessors < p.Multiprocessors {
					slicesOf += p.ComputeSlices * ci.Multiprocessors / p.Multiprocessors
				} else {
					slicesOf += p.ComputeSlices
				}
			}
			slicesOf = min(slicesOf, p.ComputeSlices)
			uuid := ""
			if len(gi.ComputeInstances) == 1 {
				uuid = gi.ComputeInstances[0].UUID
			}
			add(MIGDevice{Minor: g.Minor, GPUUUID: g.UUID, Device: model.MIGStaticDeviceName(g.Minor, gi.ID), Profile: name,
				PlacementStart: gi.Placement.Start, PlacementSize: gi.Placement.Size, UUID: uuid,
				MemoryBytes: int64(memory), Cores: migCores(g.MIG, slicesOf)})
		}
	}
	for _, c := range claims {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		for _, d := range c.Devices {
			name, err := model.ParseMIGDevice(d.Device)
			if err != nil {
				continue
			}
			g, ok := migGPUs[name.Minor]
			if !ok || g.UUID != d.UUID {
				continue // no longer a MIG GPU, or another GPU at this minor
			}
			device := d.Device
			if name.Static {
				// A record of a release that published one device per
				// compute instance (gpu-N-mig-<GI>-<CI>) holds the GPU
				// instance's device.
				device = model.MIGStaticDeviceName(name.Minor, name.GPUInstance)
			}
			dev := MIGDevice{Minor: g.Minor, GPUUUID: g.UUID, Device: device, Dynamic: !name.Static}
			if m := d.MIG; m != nil {
				dev.Profile, dev.PlacementStart, dev.PlacementSize, dev.UUID, dev.MemoryBytes = m.Profile, m.Start, m.Size, m.UUID, m.MemoryBytes
				if p, ok := g.MIG.Profile(m.ProfileID); ok {
					dev.Cores = migCores(g.MIG, p.ComputeSlices)
					if dev.MemoryBytes == 0 {
						dev.MemoryBytes = int64(p.MemoryBytes)
					}
				}
			}
			held := add(dev)
			held.Holders = append(held.Holders, MIGHolder{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Pods: pods[c.UID],
				Request: d.Request, AdminAccess: d.AdminAccess, Isolation: d.Isolation})
		}
	}
	slices.SortStableFunc(order, func(a, b key) int { return cmp.Compare(a.minor, b.minor) })
	out := make([]MIGDevice, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	return out
}

// migCores is pkg/model's cores capacity of a MIG device: 100 × its compute
// slices / the GPU's, rounded down.
func migCores(m *gpu.MIG, computeSlices int) int64 {
	if m.ComputeSlices <= 0 || computeSlices <= 0 {
		return 0
	}
	return int64(model.CoresPerGPU * computeSlices / m.ComputeSlices)
}

// migDescs are the MIG device series.
type migDescs struct {
	info, memory, cores, allocated, healthy *prometheus.Desc
}

func newMIGDescs(c prometheus.Labels) migDescs {
	dev := []string{"gpu", "uuid", "device"}
	return migDescs{
		info: prometheus.NewDesc("tessera_mig_device_info", "A MIG device (value 1): every compute instance of a static-MIG GPU, "+
			"the placements of a dynamic-MIG GPU that a prepared claim holds. uuid is the parent GPU's, mig_uuid the device's "+
			"(empty until a dynamic instance exists); placement_start and placement_size are the memory slices it covers.",
			append(slices.Clone(dev), "profile", "mig_uuid", "placement_start", "placement_size", "mode"), c),
		memory: prometheus.NewDesc("tessera_mig_device_memory_bytes", "Memory of the MIG device.", dev, c),
		cores: prometheus.NewDesc("tessera_mig_device_cores", "Compute of the MIG device in percent of its GPU's "+
			"(100 × its compute slices / the GPU's, rounded down).", dev, c),
		allocated: prometheus.NewDesc("tessera_mig_device_allocated", "Prepared claims that hold the MIG device "+
			"(admin access not counted): 0 free, 1 held. Who holds it: tessera_claim_memory_bytes with the same device.", dev, c),
		healthy: prometheus.NewDesc("tessera_mig_device_healthy", "1 when the MIG device is healthy, 0 while it is tainted "+
			"gpu.tessera.dev/unhealthy (an XID the driver attributed to it; effect in the label).", append(slices.Clone(dev), "effect"), c),
	}
}

func (d migDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{d.info, d.memory, d.cores, d.allocated, d.healthy}
}

// collectMIG sends the MIG device series, and returns what the held MIG
// devices hold of each GPU (by minor) and their claim series values.
func (d migDescs) collect(ch chan<- prometheus.Metric, devices []MIGDevice) (held map[int][2]int64, claims []claimValues) {
	held = map[int][2]int64{}
	for _, m := range devices {
		gpuName := "gpu-" + strconv.Itoa(m.Minor)
		labels := []string{gpuName, m.GPUUUID, m.Device}
		mode := "static"
		if m.Dynamic {
			mode = "dynamic"
		}
		gauge(ch, d.info, 1, append(slices.Clone(labels), m.Profile, m.UUID, strconv.Itoa(m.PlacementStart), strconv.Itoa(m.PlacementSize), mode)...)
		gauge(ch, d.memory, float64(m.MemoryBytes), labels...)
		gauge(ch, d.cores, float64(m.Cores), labels...)
		gauge(ch, d.healthy, boolValue(m.Healthy), append(slices.Clone(labels), m.Taint)...)
		holders := 0
		for _, h := range m.Holders {
			v := claimValues{labels: []string{h.Namespace, h.Name, string(h.UID), podList(h.Pods), h.Request, m.Device, "", gpuName, m.GPUUUID, h.Isolation}}
			if !h.AdminAccess {
				holders++
				v.memory, v.cores = m.MemoryBytes, m.Cores
				h := held[m.Minor]
				held[m.Minor] = [2]int64{h[0] + m.MemoryBytes, h[1] + m.Cores}
			}
			claims = append(claims, v)
		}
		gauge(ch, d.allocated, float64(holders), labels...)
	}
	return held, claims
}

// podList is the pods label: sorted, distinct, comma-separated.
func podList(pods []string) string {
	p := slices.Clone(pods)
	slices.Sort(p)
	return strings.Join(slices.Compact(p), ",")
}
