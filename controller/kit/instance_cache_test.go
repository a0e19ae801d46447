package kit

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/strata-storage/strata/engineapi"
)

func updated(name string, rev uint64) *engineapi.WatchEvent {
	return &engineapi.WatchEvent{Kind: engineapi.WatchUpdated, Instance: &engineapi.Instance{Name: name, Revision: rev}}
}

func deleted(name string) *engineapi.WatchEvent {
	return &engineapi.WatchEvent{Kind: engineapi.WatchDeleted, Instance: &engineapi.Instance{Name: name}}
}

var synced = &engineapi.WatchEvent{Kind: engineapi.WatchSynced}

func TestInstanceCache(t *testing.T) {
	type step struct {
		opened, lost bool
		ev           *engineapi.WatchEvent
	}
	tests := []struct {
		name         string
		steps        []step
		wantSynced   bool
		wantNames    []string // instances held, sorted
		wantNotified []string // names told to listeners, sorted
		wantResyncs  int
	}{
		{name: "replay then sync marker", steps: []step{{opened: true}, {ev: updated("a", 1)}, {ev: updated("b", 2)}, {ev: synced}},
			wantSynced: true, wantNames: []string{"a", "b"}, wantNotified: []string{"a", "b"}, wantResyncs: 1},
		{name: "no view before the marker", steps: []step{{opened: true}, {ev: updated("a", 1)}},
			wantNames: []string{"a"}, wantNotified: []string{"a"}},
		{name: "stale revision dropped after sync", steps: []step{{opened: true}, {ev: updated("a", 5)}, {ev: synced}, {ev: updated("a", 4)}},
			wantSynced: true, wantNames: []string{"a"}, wantNotified: []string{"a"}, wantResyncs: 1},
		{name: "delete removes and notifies", steps: []step{{opened: true}, {ev: updated("a", 1)}, {ev: synced}, {ev: deleted("a")}},
			wantSynced: true, wantNotified: []string{"a", "a"}, wantResyncs: 1},
		{name: "lost stream notifies every instance", steps: []step{{opened: true}, {ev: updated("a", 1)}, {ev: synced}, {lost: true}},
			wantNames: []string{"a"}, wantNotified: []string{"a", "a"}, wantResyncs: 1},
		{name: "instances missing from a new replay are gone (restarted instance manager)",
			steps: []step{{opened: true}, {ev: updated("a", 7)}, {ev: updated("b", 8)}, {ev: synced}, {lost: true},
				{opened: true}, {ev: updated("b", 1)}, {ev: synced}},
			wantSynced: true, wantNames: []string{"b"}, wantNotified: []string{"a", "a", "a", "b", "b", "b"}, wantResyncs: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewInstanceCache()
			var notified []string
			resyncs := 0
			c.OnChange(func(n string) { notified = append(notified, n) })
			c.OnSynced(func() { resyncs++ })
			for _, s := range tc.steps {
				switch {
				case s.opened:
					c.StreamOpened()
				case s.lost:
					c.StreamLost()
				default:
					c.Apply(s.ev)
				}
			}
			assert.Equal(t, tc.wantSynced, c.Synced())
			var names []string
			for n := range c.instances {
				names = append(names, n)
			}
			sort.Strings(names)
			sort.Strings(notified)
			assert.Equal(t, tc.wantNames, names)
			assert.Equal(t, tc.wantNotified, notified)
			assert.Equal(t, tc.wantResyncs, resyncs)
			if len(tc.wantNames) > 0 {
				inst, found, syncd := c.Get(tc.wantNames[0])
				assert.True(t, found)
				assert.Equal(t, tc.wantSynced, syncd)
				assert.Equal(t, tc.wantNames[0], inst.Name)
			}
		})
	}
}

func TestInstanceCacheStarting(t *testing.T) {
	c := NewInstanceCache()
	assert.True(t, c.Starting(), "a new manager knows nothing yet")
	c.StreamLost()
	assert.False(t, c.Starting(), "a failed stream is lost sight, not starting")
	c.StreamOpened()
	c.Apply(synced)
	assert.False(t, c.Starting())
	assert.True(t, c.Synced())
	c.StreamLost()
	assert.False(t, c.Starting())
	assert.False(t, c.Synced())
}

// TestInstanceCacheSkipsEventsItCannotUse: an event of an unknown kind, or
// without an instance, changes nothing and does not stop the stream's reader.
func TestInstanceCacheSkipsEventsItCannotUse(t *testing.T) {
	tests := []struct {
		name string
		ev   *engineapi.WatchEvent
	}{
		{"unknown kind", &engineapi.WatchEvent{Kind: engineapi.WatchUnknown, Instance: &engineapi.Instance{Name: "x"}}},
		{"update without an instance", &engineapi.WatchEvent{Kind: engineapi.WatchUpdated}},
		{"delete without an instance", &engineapi.WatchEvent{Kind: engineapi.WatchDeleted}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewInstanceCache()
			c.StreamOpened()
			c.Apply(updated("a", 1))
			assert.NotPanics(t, func() { c.Apply(tc.ev) })
			c.Apply(synced)
			_, found, ok := c.Get("a")
			assert.True(t, found && ok)
			_, found, _ = c.Get("x")
			assert.False(t, found)
		})
	}
}
