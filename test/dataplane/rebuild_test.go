package dataplane

import (
	"context"
	"fmt"
	"math/rand"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// writeStream runs qemu-io against an NBD endpoint, one invocation after
// another, each a batch of random writes (unaligned ones, zeroing, large
// ones), until halted. A batch whose qemu-io exits cleanly with no failed
// command is acknowledged; the test fails if any batch is not.
type writeStream struct {
	endpoint string
	rng      *rand.Rand
	stop     chan struct{}
	done     chan error

	mu      sync.Mutex
	acked   []string // commands of acknowledged batches, in order
	batches int
}

func startWriteStream(endpoint string, seed int64) *writeStream {
	s := &writeStream{endpoint: endpoint, rng: rand.New(rand.NewSource(seed)),
		stop: make(chan struct{}), done: make(chan error, 1)}
	go s.run()
	return s
}

func (s *writeStream) command() string {
	r := s.rng
	switch n := r.Intn(20); {
	case n < 3:
		length := int64(1+r.Intn(64)) << 12
		return fmt.Sprintf("write -z %d %d", r.Int63n(volSize-length+1), length)
	case n < 5:
		off := r.Int63n(volSize/(1<<20)) << 20
		return fmt.Sprintf("write -P 0x%02x %d %d", 1+r.Intn(255), off, 1<<20)
	default:
		length := 1 + r.Int63n(128<<10)
		off := r.Int63n(volSize - length + 1)
		if r.Intn(2) == 0 {
			length = (length + 4095) &^ 4095
			off = min(off&^4095, volSize-length)
		}
		return fmt.Sprintf("write -P 0x%02x %d %d", 1+r.Intn(255), off, length)
	}
}

func (s *writeStream) run() {
	for {
		select {
		case <-s.stop:
			s.done <- nil
			return
		default:
		}
		var batch []string
		args := []string{"-f", "raw"}
		for range 16 {
			c := s.command()
			batch = append(batch, c)
			args = append(args, "-c", c)
		}
		out, err := exec.Command("qemu-io", append(args, s.endpoint)...).CombinedOutput()
		if err != nil || strings.Contains(string(out), "failed") {
			s.done <- fmt.Errorf("qemu-io batch %d: %v:\n%s", s.batches, err, out)
			return
		}
		s.mu.Lock()
		s.acked = append(s.acked, batch...)
		s.batches++
		s.mu.Unlock()
	}
}

// waitBatches waits until n more batches are acknowledged.
func (s *writeStream) waitBatches(t *testing.T, n int) {
	t.Helper()
	s.mu.Lock()
	want := s.batches + n
	s.mu.Unlock()
	require.Eventually(t, func() bool {
		select {
		case err := <-s.done:
			s.done <- err
			return true // reported by halt
		default:
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.batches >= want
	}, time.Minute, 10*time.Millisecond)
}

// halt stops the stream after the batch in flight and returns every
// acknowledged command.
func (s *writeStream) halt(t *testing.T) []string {
	t.Helper()
	close(s.stop)
	require.NoError(t, <-s.done, "every write of the stream must succeed")
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked
}

// snapshotsView is a chain without what differs between replicas and
// engines: allocation and the head's creation time.
func snapshotsView(snaps map[string]*impb.Snapshot) map[string]string {
	out := map[string]string{}
	for name, s := range snaps {
		created := s.Created
		if name == "volume-head" {
			created = ""
		}
		out[name] = fmt.Sprintf("parent=%s children=%v removed=%v user=%v created=%s labels=%v",
			s.Parent, s.Children, s.Removed, s.UserCreated, created, s.Labels)
	}
	return out
}

// The scenario: replica failure and rebuild under a running write
// stream, with no lost write.
func TestReplicaRebuildUnderWriteStream(t *testing.T) {
	nodes := threeNodes(t)
	v := createVolume(t, "rb", nodes)
	ctx := context.Background()
	c := v.im(t)

	// A history to rebuild: snapshots, one of them removed but not purged.
	history := []string{"write -P 0x11 0 8M", "write -P 0x12 20M 4M"}
	qemuIO(t, v.endpoint, history...)
	v.snapshot(t, "s1")
	more := []string{"write -P 0x21 4M 8M", "write -z 21M 1M", "write -P 0x22 40M 6M"}
	qemuIO(t, v.endpoint, more...)
	v.snapshot(t, "s2")
	history = append(history, more...)
	require.NoError(t, c.SnapshotRemove(ctx, v.engine, "s1"))

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next, err := c.Watch(wctx)
	require.NoError(t, err)

	stream := startWriteStream(v.endpoint, 42)
	stream.waitBatches(t, 3)

	// Replica failure: kill -9 the instance manager holding rb-r3.
	require.NoError(t, nodes[2].proc.Kill())
	watchUntil(t, next, v.engine, "rb-r3 in ERR, the others RW", func(i *impb.Instance) bool {
		return i.ReplicaModes["rb-r3"] == impb.ReplicaMode_REPLICA_MODE_ERR &&
			i.ReplicaModes["rb-r1"] == impb.ReplicaMode_REPLICA_MODE_RW &&
			i.ReplicaModes["rb-r2"] == impb.ReplicaMode_REPLICA_MODE_RW
	})
	inst, err := c.InstanceGet(ctx, v.engine)
	require.NoError(t, err)
	assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_ERR, inst.ReplicaModes["rb-r3"])
	stream.waitBatches(t, 3) // writes keep succeeding on the other two

	// A new replica on the restarted node, rebuilt while writes go on.
	nodes[2].start(t)
	r4, err := nodes[2].client(t).InstanceCreate(ctx, &impb.InstanceCreateRequest{
		Name: "rb-r4", Type: impb.InstanceType_INSTANCE_TYPE_REPLICA, VolumeName: v.name, Size: volSize,
		DataDir: filepath.Join(nodes[2].diskDir, "rb-r4")})
	require.NoError(t, err)
	began := time.Now()
	require.NoError(t, c.ReplicaAdd(ctx, v.engine, "rb-r4", r4.Address, true))
	if err := c.SnapshotPurge(ctx, v.engine); err != nil {
		assert.ErrorIs(t, err, engineapi.ErrBusy, "a purge during the rebuild is refused as busy")
	} else {
		st, err := c.ReplicaRebuildStatus(ctx, v.engine)
		require.NoError(t, err)
		require.False(t, st["rb-r4"].GetIsRebuilding(), "a purge started only because the rebuild was over")
		t.Log("the rebuild was over before the purge call")
	}
	watchUntil(t, next, v.engine, "rb-r4 rebuilt and RW", func(i *impb.Instance) bool {
		st := i.RebuildStatus["rb-r4"]
		return st.GetState() == "complete" && i.ReplicaModes["rb-r4"] == impb.ReplicaMode_REPLICA_MODE_RW
	})
	took := time.Since(began)
	status, err := c.ReplicaRebuildStatus(ctx, v.engine)
	require.NoError(t, err)
	st := status["rb-r4"]
	require.NotNil(t, st)
	assert.False(t, st.IsRebuilding)
	assert.EqualValues(t, 100, st.Progress)
	assert.Equal(t, "complete", st.State)
	assert.Empty(t, st.Error)
	assert.Contains(t, []string{"rb-r1", "rb-r2"}, st.FromReplica)

	stream.waitBatches(t, 3) // and after it
	acked := stream.halt(t)
	require.NoError(t, c.ReplicaRemove(ctx, v.engine, "rb-r3"))
	inst, err = c.InstanceGet(ctx, v.engine)
	require.NoError(t, err)
	for name, m := range inst.ReplicaModes {
		assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, m, "replica %s", name)
	}
	var copied int64
	for name, s := range inst.Snapshots {
		if name != "volume-head" {
			copied += s.Size
		}
	}
	t.Logf("%d writes acknowledged in %d qemu-io runs; rebuild of %.1f MiB of snapshots took %v",
		len(acked), len(acked)/16, float64(copied)/(1<<20), took)

	// Every acknowledged write reads back, through the volume...
	want := sha256File(t, expected(t, volSize, "want", append(history, acked...)...))
	assert.Equal(t, want, readVolume(t, v.endpoint), "the volume holds every acknowledged write")
	chain, err := c.SnapshotList(ctx, v.engine)
	require.NoError(t, err)

	// ...and through an engine that has only the rebuilt replica.
	_, err = c.InstanceDelete(ctx, v.engine)
	require.NoError(t, err)
	only := crashEngine(t, nodes[0], "rb-only", "rb-only", map[string]string{"rb-r4": r4.Address})
	assert.Equal(t, want, readVolume(t, only), "the rebuilt replica alone holds every acknowledged write")
	onlyChain, err := c.SnapshotList(ctx, "rb-only")
	require.NoError(t, err)
	assert.Equal(t, snapshotsView(chain), snapshotsView(onlyChain), "the rebuilt replica has the volume's chain")
	assert.True(t, onlyChain["s1"].GetRemoved(), "the removed snapshot came along as removed")
}
