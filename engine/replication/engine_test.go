package replication

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/replicactl"
)

// memReplica is a replica double for the engine's own logic: memory-backed,
// with injectable failures, recording the writes it had at each snapshot.
type memReplica struct {
	*blockdev.Mem
	failIO, failSnapshot, refuse atomic.Bool
	reads                        atomic.Int64
	writes                       atomic.Int64
	mu                           sync.Mutex
	snapshots                    map[string]int64 // name -> writes completed when taken
	beforeSnapshot               func()           // runs as the replica takes a snapshot
}

func newMemReplica(size int64) *memReplica {
	return &memReplica{Mem: blockdev.NewMem(size), snapshots: map[string]int64{}}
}

var errInjected = errors.New("injected I/O error")

func (m *memReplica) ReadAt(p []byte, off int64) (int, error) {
	if m.failIO.Load() {
		return 0, errInjected
	}
	m.reads.Add(1)
	return m.Mem.ReadAt(p, off)
}

func (m *memReplica) WriteAt(p []byte, off int64) (int, error) {
	if m.failIO.Load() {
		return 0, errInjected
	}
	n, err := m.Mem.WriteAt(p, off)
	m.writes.Add(1)
	return n, err
}

func (m *memReplica) Control(ctx context.Context, method string, args, reply any) error {
	raw, _ := json.Marshal(args)
	var a replicactl.SnapshotArgs
	_ = json.Unmarshal(raw, &a)
	switch method {
	case replicactl.SnapshotCheck:
		if m.refuse.Load() {
			return fmt.Errorf("limit exceeded")
		}
		return nil
	case replicactl.Snapshot:
		if m.beforeSnapshot != nil {
			m.beforeSnapshot()
		}
		if err := ctx.Err(); err != nil {
			return err // as a data connection does with a call cut off
		}
		if m.failSnapshot.Load() {
			return errInjected
		}
		m.mu.Lock()
		m.snapshots[a.Name] = m.writes.Load()
		m.mu.Unlock()
		return nil
	}
	return fmt.Errorf("unknown method %s", method)
}

func (m *memReplica) Close() error { return nil }

const testSize = 1 << 20

func newTestEngine(t *testing.T, modes ...Mode) (*Engine, []*memReplica, *atomic.Int32) {
	t.Helper()
	var changes atomic.Int32
	e := New("vol", testSize, logrus.New(), func() { changes.Add(1) })
	var reps []*memReplica
	for i, mode := range modes {
		r := newMemReplica(testSize)
		require.NoError(t, e.AddReplica(fmt.Sprintf("r%d", i), fmt.Sprintf("addr%d", i), r, mode))
		reps = append(reps, r)
	}
	changes.Store(0)
	return e, reps, &changes
}

func modes(e *Engine) []Mode {
	var out []Mode
	for _, r := range e.Replicas() {
		out = append(out, r.Mode)
	}
	return out
}

func TestWritesReachEveryWriterReadsOnlyRW(t *testing.T) {
	e, reps, _ := newTestEngine(t, ModeRW, ModeRW, ModeWO)
	data := bytes.Repeat([]byte{7}, 10000)
	_, err := e.WriteAt(data, 123)
	require.NoError(t, err)
	for i, r := range reps {
		got := make([]byte, len(data))
		_, _ = r.Mem.ReadAt(got, 123)
		assert.Equal(t, data, got, "replica %d has the write", i)
	}
	buf := make([]byte, len(data))
	for i := 0; i < 10; i++ {
		_, err := e.ReadAt(buf, 123)
		require.NoError(t, err)
		assert.Equal(t, data, buf)
	}
	assert.Positive(t, reps[0].reads.Load(), "reads spread over RW replicas")
	assert.Positive(t, reps[1].reads.Load(), "reads spread over RW replicas")
	assert.Zero(t, reps[2].reads.Load(), "a WO replica is never read")
}

func TestFailures(t *testing.T) {
	tests := []struct {
		name       string
		modes      []Mode
		fail       []int // replicas whose I/O fails
		op         func(*Engine) error
		wantErr    error
		wantModes  []Mode
		wantChange bool
	}{
		{"failed writer goes ERR, write succeeds", []Mode{ModeRW, ModeRW, ModeRW}, []int{1},
			func(e *Engine) error { _, err := e.WriteAt([]byte{1}, 0); return err },
			nil, []Mode{ModeRW, ModeERR, ModeRW}, true},
		{"failed reader goes ERR, read falls back", []Mode{ModeRW, ModeRW}, []int{0, 1},
			func(e *Engine) error { _, err := e.ReadAt(make([]byte, 1), 0); return err },
			ErrNoHealthyReplica, []Mode{ModeERR, ModeERR}, true},
		{"write fails when only a WO replica took it", []Mode{ModeRW, ModeWO}, []int{0},
			func(e *Engine) error { _, err := e.WriteAt([]byte{1}, 0); return err },
			ErrNoHealthyReplica, []Mode{ModeERR, ModeWO}, true},
		{"no replica at all", nil, nil,
			func(e *Engine) error { _, err := e.WriteAt([]byte{1}, 0); return err },
			ErrNoHealthyReplica, nil, false},
		{"out of range is the caller's error, no replica fails", []Mode{ModeRW}, nil,
			func(e *Engine) error { _, err := e.WriteAt([]byte{1}, testSize); return err },
			blockdev.ErrOutOfRange, []Mode{ModeRW}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, reps, changes := newTestEngine(t, tc.modes...)
			for _, i := range tc.fail {
				reps[i].failIO.Store(true)
			}
			err := tc.op(e)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
			} else {
				assert.NoError(t, err)
			}
			assert.Equal(t, tc.wantModes, modes(e))
			assert.Equal(t, tc.wantChange, changes.Load() > 0, "watchers told of the change")
		})
	}
}

func TestSnapshotRefusalFailsNoReplica(t *testing.T) {
	e, reps, _ := newTestEngine(t, ModeRW, ModeRW, ModeRW)
	reps[2].refuse.Store(true)
	err := e.Snapshot(context.Background(), "s1", SnapshotOptions{UserCreated: true})
	require.ErrorContains(t, err, "refused by replica r2")
	assert.Equal(t, []Mode{ModeRW, ModeRW, ModeRW}, modes(e))
	for _, r := range reps {
		assert.Empty(t, r.snapshots, "no replica took the refused snapshot")
	}
}

func TestSnapshotFailureMarksThatReplicaERR(t *testing.T) {
	e, reps, _ := newTestEngine(t, ModeRW, ModeRW, ModeRW)
	reps[0].failSnapshot.Store(true)
	require.NoError(t, e.Snapshot(context.Background(), "s1", SnapshotOptions{}))
	assert.Equal(t, []Mode{ModeERR, ModeRW, ModeRW}, modes(e))
}

// A caller that goes away while a snapshot is taken (a manager killed during
// its gRPC call) fails no replica: every replica still takes it.
func TestSnapshotOutlivesItsCallerOnEveryReplica(t *testing.T) {
	e, reps, _ := newTestEngine(t, ModeRW, ModeRW, ModeRW)
	ctx, cancel := context.WithCancel(context.Background())
	reps[0].beforeSnapshot = cancel
	require.NoError(t, e.Snapshot(ctx, "s1", SnapshotOptions{UserCreated: true}))
	assert.Equal(t, []Mode{ModeRW, ModeRW, ModeRW}, modes(e))
	for i, r := range reps {
		assert.Contains(t, r.snapshots, "s1", "replica %d", i)
	}
}

// Snapshots land at one point in the write stream: under a storm of
// concurrent writes, every replica has seen exactly the same writes when it
// takes each snapshot.
func TestSnapshotsAreConsistentAcrossReplicas(t *testing.T) {
	e, reps, _ := newTestEngine(t, ModeRW, ModeRW, ModeRW)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			rng := rand.New(rand.NewSource(int64(w)))
			buf := make([]byte, 4096)
			for ctx.Err() == nil {
				_, err := e.WriteAt(buf, rng.Int63n(testSize/4096)*4096)
				assert.NoError(t, err)
			}
		})
	}
	for i := 0; i < 50; i++ {
		require.NoError(t, e.Snapshot(context.Background(), fmt.Sprintf("s%d", i), SnapshotOptions{}))
	}
	cancel()
	wg.Wait()
	for i := 0; i < 50; i++ {
		name := fmt.Sprintf("s%d", i)
		want := reps[0].snapshots[name]
		for j, r := range reps[1:] {
			assert.Equal(t, want, r.snapshots[name], "replica %d saw a different write count at %s", j+1, name)
		}
	}
	assert.Positive(t, reps[0].snapshots["s49"], "writes really ran during the snapshots")
}
