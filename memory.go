package idem

import "sync"

// maxRememberedAttempts bounds the messages whose spent attempts a
// processor remembers between deliveries.
const maxRememberedAttempts = 10_000

// attemptMemory remembers, per message ID, the attempts spent by tries
// that were given back to the broker (a commit of unknown outcome), so that
// the retry budget holds across deliveries: a message whose commits always
// end that way is dead-lettered after RetryPolicy.MaxAttempts, not looped.
// When full, an arbitrary entry is forgotten; a restart forgets all (the
// quorum queue's delivery limit still bounds those).
type attemptMemory struct {
	mu  sync.Mutex
	max int
	n   map[string]int
}

func newAttemptMemory(max int) *attemptMemory {
	return &attemptMemory{max: max, n: map[string]int{}}
}

func (m *attemptMemory) get(id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n[id]
}

func (m *attemptMemory) set(id string, spent int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.makeRoom(id)
	m.n[id] = spent
}

// makeRoom forgets an arbitrary entry when the memory is full and id is
// not in it yet. m.mu is held.
func (m *attemptMemory) makeRoom(id string) {
	if _, ok := m.n[id]; !ok && len(m.n) >= m.max {
		for k := range m.n {
			delete(m.n, k)
			break
		}
	}
}

// add adds n to id's count and returns the new count, atomically.
func (m *attemptMemory) add(id string, n int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.makeRoom(id)
	m.n[id] += n
	return m.n[id]
}

func (m *attemptMemory) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.n, id)
}
