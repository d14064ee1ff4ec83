package checkpoint

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Memory is an in-memory [Store] for tests of other packages. It validates
// and copies claims exactly as [File] does, so code that passes against
// Memory behaves the same against File. The zero value is not usable; call
// [NewMemory].
type Memory struct {
	mu       sync.Mutex
	claims   map[types.UID]Claim
	writeErr error
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{claims: map[types.UID]Claim{}}
}

// FailWrites makes every following Put and Delete that would change the
// store fail with err and change nothing, as a full disk would; nil makes
// writes succeed again.
func (m *Memory) FailWrites(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writeErr = err
}

// Get implements [Store].
func (m *Memory) Get(uid types.UID) (Claim, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return cloneOf(m.claims, uid)
}

// List implements [Store].
func (m *Memory) List() []Claim {
	m.mu.Lock()
	defer m.mu.Unlock()
	return sortedClaims(m.claims)
}

// Put implements [Store].
func (m *Memory) Put(c Claim) error {
	n, err := normalize(c)
	if err != nil {
		return fmt.Errorf("checkpoint (memory): put: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.writeErr != nil {
		return fmt.Errorf("checkpoint (memory): put claim %s: %w", n, m.writeErr)
	}
	m.claims[n.UID] = n
	return nil
}

// Delete implements [Store].
func (m *Memory) Delete(uid types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.claims[uid]
	if !ok {
		return nil
	}
	if m.writeErr != nil {
		return fmt.Errorf("checkpoint (memory): delete claim %s: %w", c, m.writeErr)
	}
	delete(m.claims, uid)
	return nil
}

// Refresh implements [Store]; memory has no other writer.
func (m *Memory) Refresh() (bool, error) { return false, nil }
