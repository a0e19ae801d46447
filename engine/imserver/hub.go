package imserver

import (
	"context"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/strata-storage/strata/engineapi/impb"
)

// hub fans instance changes out to Watch streams. A subscriber keeps only
// the newest event per instance: a slow watcher skips intermediate states
// but always ends on the current one, and holds at most one event per
// instance, however long it lags.
type hub struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

type subscriber struct {
	mu      sync.Mutex
	pending map[string]*impb.WatchEvent
	order   []string // instance names in the order their first pending event arrived
	notify  chan struct{}
}

func newHub() *hub { return &hub{subs: map[*subscriber]struct{}{}} }

// subscribe registers a watcher whose first events are the given current
// state. The caller must unsubscribe.
func (h *hub) subscribe(current []*impb.Instance) *subscriber {
	s := &subscriber{pending: map[string]*impb.WatchEvent{}, notify: make(chan struct{}, 1)}
	for _, inst := range current {
		s.put(&impb.WatchEvent{Kind: impb.WatchEvent_KIND_UPDATED, Instance: inst})
	}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

// publish hands an event to every watcher. The event is cloned once and then
// shared read-only.
func (h *hub) publish(kind impb.WatchEvent_Kind, inst *impb.Instance) {
	ev := &impb.WatchEvent{Kind: kind, Instance: proto.Clone(inst).(*impb.Instance)}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.put(ev)
	}
}

func (s *subscriber) put(ev *impb.WatchEvent) {
	name := ev.Instance.GetName()
	s.mu.Lock()
	if _, ok := s.pending[name]; !ok {
		s.order = append(s.order, name)
	}
	s.pending[name] = ev
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// drain returns the pending events, oldest instance first, without waiting.
func (s *subscriber) drain() []*impb.WatchEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*impb.WatchEvent, 0, len(s.order))
	for _, name := range s.order {
		out = append(out, s.pending[name])
	}
	s.pending, s.order = map[string]*impb.WatchEvent{}, nil
	return out
}

// next waits for events and returns all pending ones, oldest instance first.
func (s *subscriber) next(ctx context.Context) ([]*impb.WatchEvent, error) {
	for {
		if out := s.drain(); len(out) > 0 {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.notify:
		}
	}
}
