package replication

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/dataconn"
	disk "github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engine/replicaserver"
)

// servedReplica is a real replica served over a real data connection.
type servedReplica struct {
	name, addr string
	rep        *disk.Replica
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	return l
}

func serveReplica(t testing.TB, name string, size int64) *servedReplica {
	t.Helper()
	return serveReplicaWith(t, name, size, disk.CreateOptions{})
}

func serveReplicaWith(t testing.TB, name string, size int64, opts disk.CreateOptions) *servedReplica {
	t.Helper()
	rep, err := disk.Create(filepath.Join(t.TempDir(), name), size, opts)
	require.NoError(t, err)
	h := replicaserver.New(rep, quietLog())
	srv := dataconn.NewServer(h, quietLog())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(l)
	t.Cleanup(func() {
		srv.Close()
		h.Close()
		rep.Close()
	})
	return &servedReplica{name: name, addr: l.Addr().String(), rep: rep}
}

func dialBackend(ctx context.Context, addr string) (Backend, error) {
	return dataconn.Dial(ctx, addr, dataconn.Options{Timeout: 30 * time.Second, Log: quietLog()})
}

func dialT(t testing.TB, addr string) Backend {
	t.Helper()
	b, err := dialBackend(context.Background(), addr)
	require.NoError(t, err)
	return b
}

// hooked wraps a backend so a test can intercept control calls.
type hooked struct {
	Backend
	control func(method string) error // nil: pass through
}

func (h *hooked) Control(ctx context.Context, method string, args, reply any) error {
	if h.control != nil {
		if err := h.control(method); err != nil {
			return err
		}
	}
	return h.Backend.Control(ctx, method, args, reply)
}

// volumeModel is what the volume must read: data, except bytes trimmed and
// not written since, whose content is unspecified.
type volumeModel struct {
	mem     *blockdev.Mem
	mu      sync.Mutex
	unknown []bool
}

func newVolumeModel(size int64) *volumeModel {
	return &volumeModel{mem: blockdev.NewMem(size), unknown: make([]bool, size)}
}

func (m *volumeModel) known(off, length int64, yes bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := off; i < off+length; i++ {
		m.unknown[i] = !yes
	}
}

// apply runs one random operation on e and the model, inside [lo, hi).
func (m *volumeModel) apply(e *Engine, rng *rand.Rand, lo, hi int64, buf []byte) error {
	length := 1 + rng.Int63n(int64(len(buf)))
	if rng.Intn(2) == 0 {
		length = (length + blockdev.BlockSize - 1) / blockdev.BlockSize * blockdev.BlockSize
	}
	length = min(length, hi-lo)
	off := lo + rng.Int63n(hi-lo-length+1)
	if rng.Intn(2) == 0 {
		off = max(lo, off/blockdev.BlockSize*blockdev.BlockSize)
	}
	switch n := rng.Intn(10); {
	case n < 7:
		p := buf[:length]
		rng.Read(p)
		if _, err := e.WriteAt(p, off); err != nil {
			return err
		}
		_, _ = m.mem.WriteAt(p, off)
		m.known(off, length, true)
	case n < 9:
		if err := e.WriteZeroes(off, length); err != nil {
			return err
		}
		_ = m.mem.WriteZeroes(off, length)
		m.known(off, length, true)
	default:
		if err := e.Unmap(off, length); err != nil {
			return err
		}
		m.known(off, length, false)
	}
	return nil
}

// check compares a full read of the volume with the model's known bytes.
func (m *volumeModel) check(t *testing.T, got []byte, what string) {
	t.Helper()
	want := make([]byte, len(got))
	_, _ = m.mem.ReadAt(want, 0)
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range got {
		if !m.unknown[i] && got[i] != want[i] {
			t.Fatalf("%s: byte %d (block %d): got %#x, want %#x", what, i, i/blockdev.BlockSize, got[i], want[i])
		}
	}
}

func readDevice(t *testing.T, d blockdev.Device) []byte {
	t.Helper()
	p := make([]byte, d.Size())
	_, err := d.ReadAt(p, 0)
	require.NoError(t, err)
	return p
}

// chainOf is a replica's chain without allocation sizes and the head's
// creation time, which are each replica's own.
func chainOf(t *testing.T, b Backend) map[string]replicactl.Layer {
	t.Helper()
	var c replicactl.ChainReply
	require.NoError(t, b.Control(context.Background(), replicactl.Chain, nil, &c))
	for name, l := range c.Layers {
		l.Size, l.Exclusive = 0, 0 // allocation differs with the head's history
		if name == replicactl.HeadName {
			l.Created = ""
		}
		c.Layers[name] = l
	}
	return c.Layers
}

// writers runs random operations against e from n goroutines, each in its
// own part of the volume, until stop.
type writers struct {
	stop  chan struct{}
	wg    sync.WaitGroup
	err   atomic.Value
	count atomic.Int64
}

func startWriters(e *Engine, m *volumeModel, n int, seed int64) *writers {
	w := &writers{stop: make(chan struct{})}
	size := e.Size()
	for i := range n {
		w.wg.Go(func() {
			rng := rand.New(rand.NewSource(seed + int64(i)))
			buf := make([]byte, 96<<10)
			lo, hi := size*int64(i)/int64(n), size*int64(i+1)/int64(n)
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				if err := m.apply(e, rng, lo, hi, buf); err != nil {
					w.err.CompareAndSwap(nil, err)
					return
				}
				w.count.Add(1)
			}
		})
	}
	return w
}

// waitMore waits until the writers have completed n more operations from
// now: writes happen in a phase of the test because they are seen to, not
// because time passed.
func (w *writers) waitMore(t *testing.T, n int64) {
	t.Helper()
	want := w.count.Load() + n
	require.Eventually(t, func() bool {
		if err, _ := w.err.Load().(error); err != nil {
			return true // halt reports it
		}
		return w.count.Load() >= want
	}, time.Minute, time.Millisecond, "%d more writer operations", n)
}

func (w *writers) halt(t *testing.T) {
	close(w.stop)
	w.wg.Wait()
	if err, _ := w.err.Load().(error); err != nil {
		t.Fatalf("a write failed: %v", err)
	}
}

// buildChain gives the engine's replicas a tree of snapshots (s1 <- s2 <-
// s3, a branch s4 on s2 after reverting, s1 removed but not purged) and
// returns each snapshot's content.
func buildChain(t *testing.T, e *Engine, m *volumeModel) map[string][]byte {
	ctx := context.Background()
	rng := rand.New(rand.NewSource(1))
	buf := make([]byte, 256<<10)
	size := e.Size()
	write := func(n int) {
		for range n {
			p := buf[:blockdev.BlockSize*(1+rng.Int63n(64))]
			rng.Read(p)
			off := rng.Int63n(size-int64(len(p))) / blockdev.BlockSize * blockdev.BlockSize
			_, err := e.WriteAt(p, off)
			require.NoError(t, err)
			_, _ = m.mem.WriteAt(p, off)
		}
	}
	snaps := map[string][]byte{}
	snap := func(name string) {
		require.NoError(t, e.Snapshot(ctx, name, SnapshotOptions{UserCreated: true, Labels: map[string]string{"n": name}}))
		snaps[name] = readDevice(t, m.mem)
	}
	write(40)
	snap("s1")
	write(40)
	snap("s2")
	write(40)
	snap("s3")
	require.NoError(t, e.Revert(ctx, "s2"))
	_, _ = m.mem.WriteAt(snaps["s2"], 0)
	write(20)
	require.NoError(t, e.WriteZeroes(0, 256<<10)) // zero blocks hiding lower data
	_ = m.mem.WriteZeroes(0, 256<<10)
	snap("s4")
	write(20)
	require.NoError(t, e.RemoveSnapshot(ctx, "s1"))
	return snaps
}

// The scenario at the engine level: rebuild a replica under a
// running write stream, then check the rebuilt replica alone holds every
// write and the same chain.
func TestRebuildUnderWrites(t *testing.T) {
	const size = 16 << 20
	ctx := context.Background()
	e := New("vol", size, quietLog(), nil)
	var sources []*servedReplica
	for _, name := range []string{"s1", "s2"} {
		r := serveReplica(t, "r-"+name, size)
		sources = append(sources, r)
		require.NoError(t, e.AddReplica(r.name, r.addr, dialT(t, r.addr), ModeRW))
	}
	m := newVolumeModel(size)
	snaps := buildChain(t, e, m)

	w := startWriters(e, m, 2, 7)
	w.waitMore(t, 20)

	// Hold the copy after its first chunk, to look at the engine meanwhile.
	firstRead := make(chan struct{})
	release := make(chan struct{})
	var reads atomic.Int32
	target := serveReplica(t, "r-t", size)
	opts := RebuildOptions{Replica: target.name, Address: target.addr, Target: dialT(t, target.addr),
		Dial: func(ctx context.Context, addr string) (Backend, error) {
			b, err := dialBackend(ctx, addr)
			if err != nil || addr != sources[0].addr {
				return b, err
			}
			return &hooked{Backend: b, control: func(method string) error {
				if method == replicactl.ReadLayer && reads.Add(1) == 2 {
					close(firstRead)
					<-release
				}
				return nil
			}}, nil
		}}
	began := time.Now()
	done, err := e.StartRebuild(ctx, opts)
	require.NoError(t, err)
	<-firstRead

	st := e.RebuildStatus()[target.name]
	assert.True(t, st.IsRebuilding)
	assert.Equal(t, RebuildInProgress, st.State)
	assert.Equal(t, sources[0].name, st.FromReplica)
	_, mode, _ := e.Backend(target.name)
	assert.Equal(t, ModeWO, mode, "the new replica takes writes, not reads")
	assert.ErrorIs(t, e.StartPurge(ctx), ErrBusy, "no purge during a rebuild")
	assert.ErrorIs(t, e.Snapshot(ctx, "during", SnapshotOptions{}), ErrBusy)
	other := serveReplica(t, "r-other", size)
	_, err = e.StartRebuild(ctx, RebuildOptions{Replica: other.name, Address: other.addr,
		Target: dialT(t, other.addr), Dial: dialBackend})
	assert.ErrorIs(t, err, ErrBusy, "one rebuild at a time")
	w.waitMore(t, 20) // writes keep flowing meanwhile, to the new replica too
	close(release)

	require.NoError(t, <-done)
	elapsed := time.Since(began)
	st = e.RebuildStatus()[target.name]
	assert.Positive(t, st.CopiedBytes)
	assert.Equal(t, RebuildStatus{Progress: 100, State: RebuildComplete, FromReplica: sources[0].name,
		CopiedBytes: st.CopiedBytes, CopiedLayers: 5}, st, "a new replica: every layer copied, none kept")
	_, mode, _ = e.Backend(target.name)
	require.Equal(t, ModeRW, mode)
	w.waitMore(t, 20)
	w.halt(t)
	t.Logf("rebuild took %v; %d operations ran concurrently", elapsed, w.count.Load())
	for _, r := range e.Replicas() {
		require.Equal(t, ModeRW, r.Mode, "replica %s", r.Name)
	}

	// The rebuilt replica has the source's chain and reads like it.
	tb, _, _ := e.Backend(target.name)
	sb, _, _ := e.Backend(sources[0].name)
	require.Equal(t, chainOf(t, sb), chainOf(t, tb))
	assert.Contains(t, chainOf(t, tb), "s1", "removed snapshots are copied too")
	assert.True(t, bytes.Equal(readDevice(t, sb), readDevice(t, tb)), "the rebuilt replica reads like the source")

	// Alone, it holds every write.
	for _, r := range sources {
		require.NoError(t, e.RemoveReplica(r.name))
	}
	m.check(t, readDevice(t, e), "the rebuilt replica alone")
	for _, name := range []string{"s2", "s4", "s3"} {
		require.NoError(t, e.Revert(ctx, name))
		require.True(t, bytes.Equal(snaps[name], readDevice(t, e)), "snapshot %s on the rebuilt replica", name)
	}
}

func TestRebuildFailureLeavesERR(t *testing.T) {
	const size = 4 << 20
	ctx := context.Background()
	e := New("vol", size, quietLog(), nil)
	src := serveReplica(t, "r-src", size)
	require.NoError(t, e.AddReplica(src.name, src.addr, dialT(t, src.addr), ModeRW))
	m := newVolumeModel(size)
	buildChain(t, e, m)
	w := startWriters(e, m, 1, 3)

	target := serveReplica(t, "r-t", size)
	err := e.Rebuild(ctx, RebuildOptions{Replica: target.name, Address: target.addr, Target: dialT(t, target.addr),
		Dial: func(ctx context.Context, addr string) (Backend, error) {
			b, err := dialBackend(ctx, addr)
			if err != nil || addr != target.addr {
				return b, err
			}
			return &hooked{Backend: b, control: func(method string) error {
				if method == replicactl.ImportCommit {
					return errors.New("injected commit failure")
				}
				return nil
			}}, nil
		}})
	require.ErrorContains(t, err, "injected commit failure")
	st := e.RebuildStatus()[target.name]
	assert.Equal(t, RebuildError, st.State)
	assert.False(t, st.IsRebuilding)
	assert.Contains(t, st.Error, "injected commit failure")
	_, mode, ok := e.Backend(target.name)
	require.True(t, ok)
	assert.Equal(t, ModeERR, mode, "a failed rebuild leaves the replica ERR")
	assert.False(t, target.rep.Importing(), "the import was aborted")

	// The volume goes on, and structural changes are allowed again.
	w.waitMore(t, 5)
	w.halt(t)
	require.NoError(t, e.StartPurge(ctx))
	require.Eventually(t, func() bool {
		for _, st := range e.PurgeStatus(ctx) {
			if st.IsPurging {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)

	// A rebuild while a purge runs is refused.
	e.mu.Lock()
	sb := e.replicas[src.name]
	inner := sb.backend
	sb.backend = &purgingBackend{Backend: inner}
	e.mu.Unlock()
	fresh := serveReplica(t, "r-fresh", size)
	_, err = e.StartRebuild(ctx, RebuildOptions{Replica: fresh.name, Address: fresh.addr,
		Target: dialT(t, fresh.addr), Dial: dialBackend})
	require.ErrorIs(t, err, ErrBusy)
	assert.False(t, fresh.rep.Importing(), "a refused rebuild does not touch the replica")
	e.mu.Lock()
	sb.backend = inner
	e.mu.Unlock()

	// The failed replica is replaced by a good rebuild.
	require.NoError(t, e.RemoveReplica(target.name))
	w = startWriters(e, m, 1, 4)
	require.NoError(t, e.Rebuild(ctx, RebuildOptions{Replica: fresh.name, Address: fresh.addr,
		Target: dialT(t, fresh.addr), Dial: dialBackend}))
	w.halt(t)
	_, mode, _ = e.Backend(fresh.name)
	assert.Equal(t, ModeRW, mode)
	require.NoError(t, e.RemoveReplica(src.name))
	m.check(t, readDevice(t, e), "the second rebuilt replica alone")
}

// A rebuild's caller that goes away while the rebuild snapshot is taken (a
// manager killed during its gRPC call) fails the rebuild at most, never the
// source: losing the volume's one RW replica to a dead caller would fault it.
func TestRebuildStartCallerGoneKeepsSource(t *testing.T) {
	const size = 1 << 20
	e := New("vol", size, quietLog(), nil)
	src := serveReplica(t, "r-src", size)
	ctx, cancel := context.WithCancel(context.Background())
	hookedSrc := &hooked{Backend: dialT(t, src.addr), control: func(method string) error {
		if method == replicactl.Snapshot {
			cancel()
		}
		return nil
	}}
	require.NoError(t, e.AddReplica(src.name, src.addr, hookedSrc, ModeRW))
	target := serveReplica(t, "r-t", size)
	done, err := e.StartRebuild(ctx, RebuildOptions{Replica: target.name, Address: target.addr,
		Target: dialT(t, target.addr), Dial: dialBackend})
	if err == nil {
		<-done
	}
	_, mode, ok := e.Backend(src.name)
	require.True(t, ok)
	assert.Equal(t, ModeRW, mode, "the source stays RW")
	var names []string
	for name := range chainOf(t, dialT(t, src.addr)) {
		names = append(names, name)
	}
	assert.True(t, slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "rebuild-") }),
		"the source took the rebuild snapshot: %v", names)
}

// purgingBackend reports a purge in progress.
type purgingBackend struct{ Backend }

func (p *purgingBackend) Control(ctx context.Context, method string, args, reply any) error {
	if method == replicactl.PurgeStatus {
		*reply.(*replicactl.PurgeStatusReply) = replicactl.PurgeStatusReply{IsPurging: true, State: "in-progress"}
		return nil
	}
	return p.Backend.Control(ctx, method, args, reply)
}

// BenchmarkRebuild copies a written replica to an empty one over the data
// connection (go test -bench Rebuild ./engine/replication). Its baseline,
// measured in the same run, is the engine writing the same bytes to one
// replica: a rebuild moves data as the writes did, so its MB/s should be of
// the same order.
func BenchmarkRebuild(b *testing.B) {
	const size = 64 << 20
	buf := make([]byte, 4<<20)
	rand.New(rand.NewSource(1)).Read(buf)
	fill := func(b *testing.B) *Engine {
		e := New("vol", size, quietLog(), nil)
		src := serveReplica(b, "r-src", size)
		require.NoError(b, e.AddReplica(src.name, src.addr, dialT(b, src.addr), ModeRW))
		for off := int64(0); off < size; off += int64(len(buf)) {
			_, err := e.WriteAt(buf, off)
			require.NoError(b, err)
		}
		return e
	}
	b.Run("baseline: the writes", func(b *testing.B) {
		b.SetBytes(size)
		for range b.N {
			fill(b)
		}
	})
	b.Run("rebuild", func(b *testing.B) {
		b.SetBytes(size)
		for range b.N {
			b.StopTimer()
			e := fill(b)
			target := serveReplica(b, "r-t", size)
			b.StartTimer()
			require.NoError(b, e.Rebuild(context.Background(), RebuildOptions{Replica: target.name, Address: target.addr,
				Target: dialT(b, target.addr), Dial: dialBackend}))
		}
	})
}

// A remove retried while the purge of its first try runs (the manager's
// status write lost a conflict) finds the layer merged away on every
// replica between its chain read and its call: that is success, and no
// replica fails (both going ERR had faulted the volume in an e2e run).
func TestRemoveRacingItsPurgeFailsNoReplica(t *testing.T) {
	const size = 1 << 20
	ctx := context.Background()
	e := New("vol", size, quietLog(), nil)
	var purgeFirst atomic.Bool
	for i := range 2 {
		r := serveReplica(t, "r"+strconv.Itoa(i), size)
		inner := dialT(t, r.addr)
		require.NoError(t, e.AddReplica(r.name, r.addr, &hooked{Backend: inner, control: func(method string) error {
			if method == replicactl.Remove && purgeFirst.Load() {
				require.NoError(t, inner.Control(ctx, replicactl.PurgeStart, nil, nil))
				require.Eventually(t, func() bool {
					var st replicactl.PurgeStatusReply
					return inner.Control(ctx, replicactl.PurgeStatus, nil, &st) == nil && !st.IsPurging
				}, 10*time.Second, 10*time.Millisecond)
			}
			return nil
		}}, ModeRW))
	}
	_, err := e.WriteAt(bytes.Repeat([]byte{7}, 4096), 0)
	require.NoError(t, err)
	require.NoError(t, e.Snapshot(ctx, "s1", SnapshotOptions{UserCreated: true}))
	_, err = e.WriteAt(bytes.Repeat([]byte{8}, 4096), 8192)
	require.NoError(t, err)
	require.NoError(t, e.Snapshot(ctx, "s2", SnapshotOptions{UserCreated: true}))
	require.NoError(t, e.RemoveSnapshot(ctx, "s1"))

	purgeFirst.Store(true)
	require.NoError(t, e.RemoveSnapshot(ctx, "s1"), "the retry")
	assert.Equal(t, []Mode{ModeRW, ModeRW}, modes(e))
	chain, err := e.Chain(ctx)
	require.NoError(t, err)
	assert.NotContains(t, chain.Layers, "s1", "purged")
	assert.Contains(t, chain.Layers, "s2")
}
