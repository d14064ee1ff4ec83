package gpucheck

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-dev/tessera/pkg/health"
)

// The health-event check runs the kubelet plugin's own NVML event path,
// pkg/health's Watcher (EventSetCreate, then per GPU
// GetSupportedEventTypes and RegisterEvents of the XID and double-bit ECC
// events it supports), for a moment on this machine, recording what the
// driver answered for the checked GPU; then it asks the driver event type by
// event type, on a set of its own, which of NVML's device events it accepts.

// eventTypes are NVML's device event types (nvml.h, go-nvml's constants),
// by name.
var eventTypes = []struct {
	name string
	bit  uint64
}{
	{"XidCriticalError", nvml.EventTypeXidCriticalError},
	{"DoubleBitEccError", nvml.EventTypeDoubleBitEccError},
	{"SingleBitEccError", nvml.EventTypeSingleBitEccError},
	{"PState", nvml.EventTypePState},
	{"Clock", nvml.EventTypeClock},
	{"PowerSourceChange", nvml.EventTypePowerSourceChange},
	{"MigConfigChange", nvml.EventMigConfigChange},
	{"SingleBitEccErrorStorm", nvml.EventTypeSingleBitEccErrorStorm},
	{"DramRetirementEvent", nvml.EventTypeDramRetirementEvent},
	{"DramRetirementFailure", nvml.EventTypeDramRetirementFailure},
	{"NonFatalPoisonError", nvml.EventTypeNonFatalPoisonError},
	{"FatalPoisonError", nvml.EventTypeFatalPoisonError},
	{"GpuUnavailableError", nvml.EventTypeGpuUnavailableError},
	{"GpuRecoveryAction", nvml.EventTypeGpuRecoveryAction},
}

func eventNames(mask uint64) string {
	var out []string
	for _, t := range eventTypes {
		if mask&t.bit != 0 {
			out = append(out, t.name)
		}
	}
	if len(out) == 0 {
		return fmt.Sprintf("none (%#x)", mask)
	}
	return strings.Join(out, ", ")
}

// recordingNVML is the NVML the watcher gets: the real one, whose devices
// record what the driver answered to the watcher's registration.
type recordingNVML struct {
	nvml.Interface
	mu   sync.Mutex
	seen map[string]*registration
}

type registration struct {
	supported    uint64
	supportedRet nvml.Return
	registered   uint64
	registerRet  nvml.Return
	calls        int
}

func (r *recordingNVML) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	dev, ret := r.Interface.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return dev, ret
	}
	uuid, _ := dev.GetUUID()
	return &recordingDevice{Device: dev, uuid: uuid, rec: r}, ret
}

func (r *recordingNVML) record(uuid string, f func(*registration)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]*registration{}
	}
	reg := r.seen[uuid]
	if reg == nil {
		reg = &registration{}
		r.seen[uuid] = reg
	}
	f(reg)
}

type recordingDevice struct {
	nvml.Device
	uuid string
	rec  *recordingNVML
}

func (d *recordingDevice) GetSupportedEventTypes() (uint64, nvml.Return) {
	mask, ret := d.Device.GetSupportedEventTypes()
	d.rec.record(d.uuid, func(r *registration) { r.supported, r.supportedRet = mask, ret })
	return mask, ret
}

func (d *recordingDevice) RegisterEvents(types uint64, set nvml.EventSet) nvml.Return {
	ret := d.Device.RegisterEvents(types, set)
	d.rec.record(d.uuid, func(r *registration) { r.registered, r.registerRet = types, ret; r.calls++ })
	return ret
}

func (n *node) healthCheck(ctx context.Context) Check {
	c := Check{Name: "health-event registration (pkg/health's watcher)"}
	rec := &recordingNVML{Interface: n.cfg.NVML}
	w := health.Watcher{Lib: rec, Tracker: health.NewTracker(health.DefaultPolicy(), nil), WaitTimeout: 200 * time.Millisecond}
	wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	err := w.Run(wctx)
	cancel()
	if err != nil {
		c.Status, c.Detail = StatusError, "the watcher could not watch: "+err.Error()
		return c
	}
	rec.mu.Lock()
	reg := rec.seen[n.gpu.UUID]
	rec.mu.Unlock()
	if reg == nil {
		c.Status, c.Detail = StatusError, fmt.Sprintf("the watcher did not look at gpu-%d (%s)", n.gpu.Minor, n.gpu.UUID)
		return c
	}
	var detail []string
	bad := false
	switch {
	case reg.supportedRet != nvml.SUCCESS:
		bad = true
		detail = append(detail, fmt.Sprintf("nvmlDeviceGetSupportedEventTypes: %v", reg.supportedRet))
	case reg.calls == 0:
		bad = true
		detail = append(detail, fmt.Sprintf("the driver supports %s, none of the XID and double-bit ECC events the watcher registers: this GPU's faults would go unseen", eventNames(reg.supported)))
	case reg.registerRet != nvml.SUCCESS:
		bad = true
		detail = append(detail, fmt.Sprintf("the watcher's nvmlDeviceRegisterEvents(%s): %v", eventNames(reg.registered), reg.registerRet))
	default:
		detail = append(detail, fmt.Sprintf("the watcher registered %s (the driver supports %s)", eventNames(reg.registered), eventNames(reg.supported)))
	}
	detail = append(detail, n.eventTypesAccepted())
	if n.cfg.Mock {
		detail = append(detail, "mock: the mock NVML's event support")
	}
	if bad {
		c.Status, c.Detail = StatusMismatch, strings.Join(detail, "; ")
		return c
	}
	c.Status, c.Detail = n.measured(), strings.Join(detail, "; ")
	return c
}

// eventTypesAccepted registers each of NVML's event types alone, on a set
// of its own, and says which the driver accepts for the checked GPU.
func (n *node) eventTypesAccepted() string {
	set, ret := n.cfg.NVML.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Sprintf("nvmlEventSetCreate: %v", ret)
	}
	defer set.Free()
	dev, ret := n.cfg.NVML.DeviceGetHandleByUUID(n.gpu.UUID)
	if ret != nvml.SUCCESS {
		return fmt.Sprintf("nvmlDeviceGetHandleByUUID: %v", ret)
	}
	var ok, refused []string
	for _, t := range eventTypes {
		if ret := dev.RegisterEvents(t.bit, set); ret == nvml.SUCCESS {
			ok = append(ok, t.name)
		} else {
			refused = append(refused, fmt.Sprintf("%s (%v)", t.name, ret))
		}
	}
	return fmt.Sprintf("one by one, the driver accepts %s and refuses %s", orNone(ok), orNone(refused))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
