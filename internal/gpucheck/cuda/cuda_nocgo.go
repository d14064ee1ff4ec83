//go:build !cgo || !linux

package cuda

import "fmt"

// Lib is unavailable without cgo on Linux.
type Lib struct{}

// Open fails: the probe loads the driver with dlopen, which needs cgo.
func Open() (*Lib, error) {
	return nil, fmt.Errorf("%w: this binary was built without cgo (build with CGO_ENABLED=1 on Linux)", ErrNotLoaded)
}

// Init is unreachable without [Open].
func (l *Lib) Init() (DeviceInfo, error) { return DeviceInfo{}, ErrNotLoaded }

// Close is unreachable without [Open].
func (l *Lib) Close() error { return ErrNotLoaded }

// MemInfo is unreachable without [Open].
func (l *Lib) MemInfo() (uint64, uint64, error) { return 0, 0, ErrNotLoaded }

// Ptr is a device allocation.
type Ptr uint64

// Alloc is unreachable without [Open].
func (l *Lib) Alloc(uint64) (Ptr, error) { return 0, ErrNotLoaded }

// Free is unreachable without [Open].
func (l *Lib) Free(Ptr) error { return ErrNotLoaded }

// ReadU64 is unreachable without [Open].
func (l *Lib) ReadU64(Ptr) (uint64, error) { return 0, ErrNotLoaded }

// Synchronize is unreachable without [Open].
func (l *Lib) Synchronize() error { return ErrNotLoaded }

// Module is a loaded PTX module.
type Module struct{}

// LoadPTX is unreachable without [Open].
func (l *Lib) LoadPTX(string) (*Module, error) { return nil, ErrNotLoaded }

// Unload is unreachable without [Open].
func (m *Module) Unload() error { return ErrNotLoaded }

// Function is a kernel entry of a module.
type Function struct{}

// Function is unreachable without [Open].
func (m *Module) Function(string) (*Function, error) { return nil, ErrNotLoaded }

// LaunchSpin is unreachable without [Open].
func (l *Lib) LaunchSpin(*Function, uint32, uint32, Ptr, uint64) error { return ErrNotLoaded }

// Has is false without [Open].
func (l *Lib) Has(Allocator) bool { return false }

// Supported is ErrNotLoaded without [Open].
func (l *Lib) Supported(Allocator) error { return ErrNotLoaded }

// Granularity is unreachable without [Open].
func (l *Lib) Granularity(Allocator) (uint64, error) { return 0, ErrNotLoaded }

// AllocWith is unreachable without [Open].
func (l *Lib) AllocWith(a Allocator, bytes uint64) (Allocation, error) {
	return Allocation{Allocator: a, Bytes: bytes}, ErrNotLoaded
}

// FreeAllocation is unreachable without [Open].
func (l *Lib) FreeAllocation(Allocation) error { return ErrNotLoaded }
