package kit

import (
	"sync"

	"github.com/strata-storage/strata/engineapi"
)

// InstanceCache is this node's view of its instance manager's instances, fed
// by the one Watch stream the InstanceManager controller holds open. Engine
// and replica status syncs read it instead of calling the instance manager,
// so a status sync never makes a gRPC call and an idle node costs no polling.
type InstanceCache struct {
	mu     sync.RWMutex
	synced bool
	// failed is set once a stream failed and cleared by the next sync: until
	// then (a manager just started) the cache knows nothing yet, which is
	// not the same as having lost sight of the instance manager.
	failed    bool
	instances map[string]*engineapi.Instance
	// seen collects the names replayed since the stream (re)opened; at the
	// sync marker the instances not replayed are gone.
	seen      map[string]bool
	listeners []func(name string)
	// resyncListeners learn when the cache becomes synced: objects whose
	// instance does not exist yet (nothing to notify by name) were left
	// alone while the cache was unsynced and need another look.
	resyncListeners []func()
}

// NewInstanceCache returns an empty, unsynced cache.
func NewInstanceCache() *InstanceCache {
	return &InstanceCache{instances: map[string]*engineapi.Instance{}}
}

// OnChange registers fn to be called with an instance's name whenever what
// the cache knows of it changes (including when the cache loses its stream).
// Controllers enqueue the object of that name.
func (c *InstanceCache) OnChange(fn func(name string)) {
	c.mu.Lock()
	c.listeners = append(c.listeners, fn)
	c.mu.Unlock()
}

// OnSynced registers fn to be called each time the cache becomes synced.
func (c *InstanceCache) OnSynced(fn func()) {
	c.mu.Lock()
	c.resyncListeners = append(c.resyncListeners, fn)
	c.mu.Unlock()
}

// Get returns the last known state of an instance, whether it is known, and
// whether the cache is in sync with a live stream. An unsynced cache knows
// nothing for sure: callers report unknown rather than stopped.
func (c *InstanceCache) Get(name string) (inst *engineapi.Instance, found, synced bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	inst, found = c.instances[name]
	return inst, found, c.synced
}

// List returns every instance the cache knows, in no order.
func (c *InstanceCache) List() []*engineapi.Instance {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]*engineapi.Instance, 0, len(c.instances))
	for _, inst := range c.instances {
		out = append(out, inst)
	}
	return out
}

// Starting tells that no stream has synced or failed yet since this manager
// started: instance status is better left as it was than turned unknown.
func (c *InstanceCache) Starting() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return !c.synced && !c.failed
}

// Synced tells whether the cache reflects a live stream.
func (c *InstanceCache) Synced() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.synced
}

// StreamOpened starts a replay: the instance manager is about to send its
// current state again, then the sync marker.
func (c *InstanceCache) StreamOpened() {
	c.mu.Lock()
	c.seen = map[string]bool{}
	c.mu.Unlock()
}

// StreamLost marks the cache unsynced and tells every listener about every
// instance it held, so their objects are re-evaluated as unknown.
func (c *InstanceCache) StreamLost() {
	c.mu.Lock()
	c.failed = true
	if !c.synced {
		c.mu.Unlock()
		return
	}
	c.synced = false
	names := make([]string, 0, len(c.instances))
	for n := range c.instances {
		names = append(names, n)
	}
	c.mu.Unlock()
	c.notify(names...)
}

// Apply folds one Watch event into the cache.
func (c *InstanceCache) Apply(ev *engineapi.WatchEvent) {
	if ev.Kind == engineapi.WatchUnknown || (ev.Kind != engineapi.WatchSynced && ev.Instance == nil) {
		return // nothing this cache can use; the stream goes on
	}
	var changed []string
	becameSynced := false
	c.mu.Lock()
	switch ev.Kind {
	case engineapi.WatchUpdated:
		inst := ev.Instance
		if c.seen != nil {
			c.seen[inst.Name] = true
		}
		// Revisions only grow within one instance manager's life; a restarted
		// one starts again from 1, and its replay follows streamOpened.
		if old, ok := c.instances[inst.Name]; !ok || c.seen != nil || old.Revision < inst.Revision {
			c.instances[inst.Name] = inst
			changed = append(changed, inst.Name)
		}
	case engineapi.WatchDeleted:
		name := ev.Instance.Name
		if _, ok := c.instances[name]; ok {
			delete(c.instances, name)
			changed = append(changed, name)
		}
	case engineapi.WatchSynced:
		for name := range c.instances {
			if c.seen != nil && !c.seen[name] {
				delete(c.instances, name)
				changed = append(changed, name)
			}
		}
		c.seen = nil
		becameSynced = !c.synced
		c.synced, c.failed = true, false
	}
	resync := append([]func(){}, c.resyncListeners...)
	c.mu.Unlock()
	c.notify(changed...)
	if becameSynced {
		for _, fn := range resync {
			fn()
		}
	}
}

func (c *InstanceCache) notify(names ...string) {
	if len(names) == 0 {
		return
	}
	c.mu.RLock()
	listeners := append([]func(string){}, c.listeners...)
	c.mu.RUnlock()
	for _, n := range names {
		for _, fn := range listeners {
			fn(n)
		}
	}
}
