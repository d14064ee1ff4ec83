package health

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/gpu"
)

// watchedEvents are the NVML event types the watcher registers for (those
// each GPU supports of them).
const watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError

// Watcher feeds a Tracker from NVML's event API. The caller has initialised
// Lib (gpu.Open) and shuts it down after Run returned.
type Watcher struct {
	Lib     nvml.Interface
	Tracker *Tracker
	// WaitTimeout bounds one nvmlEventSetWait; between waits the watcher
	// recovers GPUs whose period passed and re-probes lost ones. Zero: 2s.
	WaitTimeout time.Duration
}

// watchedGPU is one GPU the watcher registered (or tried to).
type watchedGPU struct {
	uuid string
	dev  nvml.Device
}

// Run registers every GPU for critical XID and double-bit ECC events (as far
// as each supports them) and feeds what arrives to the tracker until ctx is
// done. A GPU that NVML reports lost (at registration, from a wait, or when
// probed) is reported as KindGPULost and probed again after every wait, so
// it stays unhealthy until it answers again and then for the recovery period.
//
// It returns nil when ctx is done, and an error when no event set can be
// created (old drivers, some virtualised GPUs): then nothing is watched and
// the caller decides whether that is fatal.
func (w *Watcher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	timeout := w.WaitTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	set, ret := w.Lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvmlEventSetCreate: %w", ret)
	}
	defer set.Free()

	count, ret := w.Lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvmlDeviceGetCount: %w", ret)
	}
	var gpus []watchedGPU
	for i := range count {
		dev, ret := w.Lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			logger.Error(ret, "GPU not watched for errors", "index", i)
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			logger.Error(ret, "GPU not watched for errors: no UUID", "index", i)
			continue
		}
		g := watchedGPU{uuid: uuid, dev: dev}
		gpus = append(gpus, g)
		if err := register(dev, set); err != nil {
			if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
				w.observe(ctx, Event{UUID: uuid, Kind: KindGPULost})
				continue
			}
			logger.Error(err, "GPU not watched for errors", "uuid", uuid)
		}
	}
	logger.Info("Watching GPUs for errors", "gpus", len(gpus), "policy", w.Tracker.Policy())

	for {
		if ctx.Err() != nil {
			return nil
		}
		data, ret := w.Lib.EventSetWait(set, uint32(timeout/time.Millisecond))
		switch ret {
		case nvml.SUCCESS:
			w.handle(ctx, data)
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			// The wait does not say which GPU; probing does.
			for _, g := range gpus {
				w.probe(ctx, g)
			}
		default:
			logger.Error(ret, "nvmlEventSetWait failed")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(timeout):
			}
		}
		for _, g := range gpus {
			if st := w.Tracker.Status(g.uuid); st.Lost {
				w.probe(ctx, g)
			}
		}
		if w.Tracker.Recover() {
			logger.Info("GPU health changed: recovered", "unhealthy", len(w.Tracker.Unhealthy()))
		}
	}
}

func register(dev nvml.Device, set nvml.EventSet) error {
	supported, ret := dev.GetSupportedEventTypes()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvmlDeviceGetSupportedEventTypes: %w", ret)
	}
	types := supported & watchedEvents
	if types == 0 {
		return fmt.Errorf("GPU supports neither XID nor double-bit ECC events (supported mask %#x)", supported)
	}
	if ret := dev.RegisterEvents(types, set); ret != nvml.SUCCESS {
		return fmt.Errorf("nvmlDeviceRegisterEvents: %w", ret)
	}
	return nil
}

// handle turns one NVML event into a tracker event.
func (w *Watcher) handle(ctx context.Context, data nvml.EventData) {
	if data.Device == nil {
		return
	}
	uuid, ret := data.Device.GetUUID()
	if ret != nvml.SUCCESS {
		klog.FromContext(ctx).Error(ret, "Event from a GPU without UUID", "type", data.EventType, "data", data.EventData)
		return
	}
	switch {
	case data.EventType&nvml.EventTypeXidCriticalError != 0:
		w.observe(ctx, Event{UUID: uuid, Kind: KindXID, XID: data.EventData, MIG: migScope(data)})
	case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
		w.observe(ctx, Event{UUID: uuid, Kind: KindDoubleBitECC})
	}
}

// probe asks the GPU something cheap; ERROR_GPU_IS_LOST (again) counts.
func (w *Watcher) probe(ctx context.Context, g watchedGPU) {
	if _, ret := g.dev.GetMemoryInfo(); ret == nvml.ERROR_GPU_IS_LOST {
		w.observe(ctx, Event{UUID: g.uuid, Kind: KindGPULost})
	}
}

func (w *Watcher) observe(ctx context.Context, e Event) {
	effect, counts := w.Tracker.Policy().Classify(e)
	logger := klog.FromContext(ctx)
	if e.MIG != nil {
		logger = logger.WithValues("mig", e.MIG.String())
	}
	if !counts {
		logger.V(2).Info("Ignored GPU error event", "uuid", e.UUID, "event", e.String())
		return
	}
	if w.Tracker.Observe(e) {
		logger.Info("GPU health changed: unhealthy", "uuid", e.UUID, "event", e.String(), "effect", effect)
	} else {
		logger.V(4).Info("GPU error event", "uuid", e.UUID, "event", e.String())
	}
}

// migScope is the MIG device an event's data names (gpu.EventMIGInstance),
// with the GPU instance's profile and placement as NVML reports them now;
// nil for an event about the whole GPU.
func migScope(data nvml.EventData) *MIGScope {
	gi, ci, ok := gpu.EventMIGInstance(data.GpuInstanceId, data.ComputeInstanceId)
	if !ok {
		return nil
	}
	s := &MIGScope{GPUInstance: gi, ComputeInstance: ci, ProfileID: -1}
	inst, ret := data.Device.GetGpuInstanceById(gi)
	if ret != nvml.SUCCESS {
		return s
	}
	info, ret := inst.GetInfo()
	if ret != nvml.SUCCESS {
		return s
	}
	s.ProfileID = int(info.ProfileId)
	s.Placement = gpu.MIGPlacement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}
	return s
}
