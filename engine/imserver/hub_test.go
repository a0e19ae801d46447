package imserver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi/impb"
)

func inst(name string, rev uint64) *impb.Instance { return &impb.Instance{Name: name, Revision: rev} }

func TestHubStartsWithCurrentStateAndCoalesces(t *testing.T) {
	h := newHub()
	s := h.subscribe([]*impb.Instance{inst("a", 1), inst("b", 1)})
	defer h.unsubscribe(s)

	for rev := uint64(2); rev <= 1000; rev++ {
		h.publish(impb.WatchEvent_KIND_UPDATED, inst("a", rev))
	}
	h.publish(impb.WatchEvent_KIND_DELETED, inst("c", 1))

	evs, err := s.next(context.Background())
	require.NoError(t, err)
	var got []string
	for _, ev := range evs {
		got = append(got, fmt.Sprintf("%s:%d:%s", ev.Instance.Name, ev.Instance.Revision, ev.Kind))
	}
	assert.Equal(t, []string{"a:1000:KIND_UPDATED", "b:1:KIND_UPDATED", "c:1:KIND_DELETED"}, got,
		"a lagging watcher gets the newest state of each instance, in first-seen order")
}

func TestHubPublishedEventIsACopy(t *testing.T) {
	h := newHub()
	s := h.subscribe(nil)
	defer h.unsubscribe(s)
	i := inst("a", 1)
	h.publish(impb.WatchEvent_KIND_UPDATED, i)
	i.Revision = 99
	evs, err := s.next(context.Background())
	require.NoError(t, err)
	assert.EqualValues(t, 1, evs[0].Instance.Revision, "later changes to the instance do not leak into sent events")
}

func TestHubNextWaitsAndStopsWithContext(t *testing.T) {
	h := newHub()
	s := h.subscribe(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := s.next(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	h.unsubscribe(s)
	h.publish(impb.WatchEvent_KIND_UPDATED, inst("a", 1))
	assert.Empty(t, s.pending, "an unsubscribed watcher gets nothing")
}

func TestHubDrainDoesNotWait(t *testing.T) {
	h := newHub()
	s := h.subscribe(nil)
	defer h.unsubscribe(s)
	assert.Empty(t, s.drain(), "nothing pending, no wait")
	h.publish(impb.WatchEvent_KIND_UPDATED, inst("a", 1))
	assert.Len(t, s.drain(), 1)
}
