package migrator

import (
	"fmt"
	"sync"
	"time"
)

// Params name a component's table and what a new table records.
type Params struct {
	Engine Engine
	// Table is the table as the user writes it, optionally
	// schema-qualified; "" is the component's default.
	Table string
	// Partitioned selects the inbox's partitioned layout.
	Partitioned bool
	// Window is the retention window a new inbox records (0: the default).
	Window time.Duration
	// Shards is the shard count a new outbox records (0: the default).
	Shards int
}

// Factory renders a component for its parameters.
type Factory func(Params) (*Component, error)

var (
	mu        sync.Mutex
	factories = map[string]Factory{}
)

// Register makes a component known by name, from the package that owns its
// SQL (in an init function): the public migrator imports that package and
// asks for it here, so the feature's SQL stays beside its code.
func Register(name string, f Factory) {
	mu.Lock()
	defer mu.Unlock()
	factories[name] = f
}

// New renders the component registered as name.
func New(name string, p Params) (*Component, error) {
	mu.Lock()
	f := factories[name]
	mu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("no idem component %q is registered", name)
	}
	return f(p)
}
