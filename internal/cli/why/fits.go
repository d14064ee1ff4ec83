package why

import "github.com/tessera-dev/tessera/pkg/model"

// fitsNow is the largest share and the free whole GPUs of a node, as a
// claim without tolerations would find them.
func (e *explainer) fitsNow(node string) FitsNow {
	var f FitsNow
	for _, d := range e.nodeDevices(node) {
		minor, kind, err := model.ParseDevice(d.dev.Name)
		if err != nil || kind == model.KindLent || hasBlockingTaint(d.dev) {
			continue
		}
		if len(e.counterReasons(d)) > 0 && !(d.multi() && e.allocated(d.id)) {
			continue
		}
		if kind == model.KindWhole {
			if !e.allocated(d.id) {
				f.WholeGPUs++
			}
			continue
		}
		used := e.consumed(d.id)
		s := Share{GPU: model.WholeDeviceName(minor)}
		if c, ok := d.dev.Capacity[model.Memory]; ok {
			s.MemoryBytes = c.Value.Value() - used[model.Memory]
		}
		if c, ok := d.dev.Capacity[model.Cores]; ok {
			s.Cores = c.Value.Value() - used[model.Cores]
		}
		if s.MemoryBytes <= 0 {
			continue
		}
		if l := f.LargestShare; l == nil || s.MemoryBytes > l.MemoryBytes || (s.MemoryBytes == l.MemoryBytes && s.Cores > l.Cores) {
			f.LargestShare = &s
		}
	}
	f.MIG = e.migFitsNow(node)
	return f
}
