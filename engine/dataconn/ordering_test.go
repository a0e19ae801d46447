package dataconn

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

// The barrier guarantee is about the connection's order: a barrier sees
// every request sent before it (lower seq) and none sent after it. Timing
// alone cannot check that: a write that *completed* before the barrier
// call was made is applied whatever the server does, and one *issued*
// after it returned cannot reach a snapshot already taken. The writes that
// matter are those in flight while the barrier is sent. So the test
// records each request's seq through a client hook and demands an exact
// match: block w of a snapshot holds exactly writer w's last version with
// seq < the barrier's seq. Each writer has one write in flight at a time
// and owns its block, so that version is well defined. The device delays
// writes at random, so a server that does not wait for in-flight writes,
// or lets later ones start early, produces a different snapshot; the
// "broken server" subtests prove the check notices.

type barrierResult struct {
	mismatches []string
	waitedFor  int // (snapshot, writer) pairs whose write was still in flight when the barrier was called
}

func TestBarrier(t *testing.T) {
	for _, kind := range []string{"control", "flush"} {
		t.Run(kind, func(t *testing.T) {
			checkGoroutines(t)
			res := runBarrierScenario(t, kind, false)
			noMismatches(t, res.mismatches)
			// Otherwise the scenario never tested the interesting case.
			assert.Positive(t, res.waitedFor, "no barrier had a write in flight to wait for")
		})
	}
}

func TestBarrierCheckCatchesBrokenServer(t *testing.T) {
	for _, kind := range []string{"control", "flush"} {
		t.Run(kind, func(t *testing.T) {
			res := runBarrierScenario(t, kind, true)
			assert.NotEmpty(t, res.mismatches, "an unordered server passed the barrier check")
			t.Logf("%d mismatches, e.g. %v", len(res.mismatches), res.mismatches[:min(3, len(res.mismatches))])
		})
	}
}

func noMismatches(t *testing.T, mismatches []string) {
	t.Helper()
	if len(mismatches) > 0 {
		t.Errorf("%d mismatches; the first:\n%s", len(mismatches), strings.Join(mismatches[:min(10, len(mismatches))], "\n"))
	}
}

// snapDev records a copy of the device when flushed.
type snapDev struct {
	jitterDev
	mem *blockdev.Mem
	mu  sync.Mutex
	// snaps are copies taken at each barrier, in order.
	snaps [][]byte
}

func (d *snapDev) snapshot() {
	p := make([]byte, d.mem.Size())
	if _, err := d.mem.ReadAt(p, 0); err != nil {
		panic(err)
	}
	d.mu.Lock()
	d.snaps = append(d.snaps, p)
	d.mu.Unlock()
}

func (d *snapDev) Flush() error {
	d.snapshot()
	return nil
}

func runBarrierScenario(t *testing.T, kind string, broken bool) barrierResult {
	const writers, barriers = 16, 40
	const bs = blockdev.BlockSize
	mem := blockdev.NewMem(writers * bs)
	dev := &snapDev{jitterDev: jitterDev{Device: mem, maxDelay: 300 * time.Microsecond}, mem: mem}
	h := &testHandler{Device: dev}
	h.control = func(_ context.Context, method string, _ json.RawMessage) (json.RawMessage, error) {
		if method != "snapshot" {
			return nil, ErrUnknownMethod
		}
		dev.snapshot()
		return nil, nil
	}
	_, addr := startServer(t, h, func(s *Server) { s.unordered = broken })
	c := dial(t, addr, Options{Timeout: 20 * time.Second})

	// Everything below is written by the hook (in seq order, under the
	// client lock) or by one goroutine each, and read after wg.Wait.
	type write struct {
		seq            uint64
		issued, closed int64 // logical clock around the WriteAt call
	}
	versions := make([][]write, writers) // versions[w][v-1]
	var barrierSeqs []uint64
	setHook(c, func(cl *call) {
		switch cl.hdr.Op {
		case OpWrite:
			w, v := binary.BigEndian.Uint32(cl.payload), binary.BigEndian.Uint32(cl.payload[4:])
			if int(v) != len(versions[w])+1 {
				panic(fmt.Sprintf("writer %d: version %d enqueued after %d", w, v, len(versions[w])))
			}
			versions[w] = append(versions[w], write{seq: cl.hdr.Seq})
		case OpControl, OpFlush:
			barrierSeqs = append(barrierSeqs, cl.hdr.Seq)
		}
	})

	var clock atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := uint32(1); !stop.Load(); v++ {
				issued := clock.Add(1)
				if _, err := c.WriteAt(versionBlock(uint32(w), v), int64(w*bs)); err != nil {
					errs <- err
					return
				}
				closed := clock.Add(1)
				c.mu.Lock() // the hook appended this version under the same lock
				versions[w][v-1].issued, versions[w][v-1].closed = issued, closed
				c.mu.Unlock()
			}
		}()
	}
	type span struct{ start, end int64 }
	spans := make([]span, 0, barriers)
	for range barriers {
		time.Sleep(rand.N(2 * time.Millisecond))
		start := clock.Add(1)
		var err error
		if kind == "flush" {
			err = c.Flush()
		} else {
			err = c.Control(context.Background(), "snapshot", nil, nil)
		}
		spans = append(spans, span{start, clock.Add(1)})
		if err != nil {
			errs <- err
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// The server's writes reach us through the socket, which the race
	// detector does not see as synchronisation; take the locks.
	dev.mu.Lock()
	snaps := dev.snaps
	dev.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, snaps, barriers)
	require.Len(t, barrierSeqs, barriers)

	var res barrierResult
	for k, snap := range snaps {
		for w := range writers {
			got, err := decodeVersion(snap[w*bs:(w+1)*bs], uint32(w))
			if err != nil {
				res.mismatches = append(res.mismatches, fmt.Sprintf("barrier %d writer %d: %v", k, w, err))
				continue
			}
			// Exact: the last version sent before the barrier.
			want := 0
			for v, wr := range versions[w] {
				if wr.seq < barrierSeqs[k] {
					want = v + 1
				}
			}
			if int(got) != want {
				res.mismatches = append(res.mismatches, fmt.Sprintf("barrier %d writer %d: version %d, want %d", k, w, got, want))
				if len(res.mismatches) < 3 {
					t.Logf("barrier seq %d span %v; writer %d versions %+v", barrierSeqs[k], spans[k], w, versions[w][:min(len(versions[w]), want+2)])
				}
			}
			if want > 0 && versions[w][want-1].closed > spans[k].start {
				res.waitedFor++
			}
			// The timing bounds the brief states, implied by the exact check.
			for v, wr := range versions[w] {
				if wr.closed != 0 && wr.closed < spans[k].start && int(got) < v+1 {
					res.mismatches = append(res.mismatches, fmt.Sprintf("barrier %d writer %d: misses version %d completed before it", k, w, v+1))
				}
				if wr.issued > spans[k].end && int(got) >= v+1 {
					res.mismatches = append(res.mismatches, fmt.Sprintf("barrier %d writer %d: holds version %d issued after it", k, w, v+1))
				}
			}
		}
	}
	return res
}

// versionBlock is writer w's block at version v: (w, v) repeated.
func versionBlock(w, v uint32) []byte {
	p := make([]byte, blockdev.BlockSize)
	for i := 0; i < len(p); i += 8 {
		binary.BigEndian.PutUint32(p[i:], w)
		binary.BigEndian.PutUint32(p[i+4:], v)
	}
	return p
}

func decodeVersion(p []byte, w uint32) (uint32, error) {
	if bytes.Equal(p, make([]byte, len(p))) {
		return 0, nil
	}
	v := binary.BigEndian.Uint32(p[4:])
	if !bytes.Equal(p, versionBlock(w, v)) {
		return 0, fmt.Errorf("torn or foreign block")
	}
	return v, nil
}

// TestSeqOrderIsApplyOrder: with overlapping reads, writes and zeroing from
// many goroutines, the outcome must be as if the server ran the requests
// one by one in seq order: every read returns what that replay shows at
// its seq, and the device ends as the replay does.
func TestSeqOrderIsApplyOrder(t *testing.T) {
	checkGoroutines(t)
	noMismatches(t, runSeqOrderScenario(t, false))
}

func TestSeqOrderCheckCatchesBrokenServer(t *testing.T) {
	mismatches := runSeqOrderScenario(t, true)
	assert.NotEmpty(t, mismatches, "an unordered server passed the seq-order check")
	t.Logf("%d mismatches, e.g. %v", len(mismatches), mismatches[:min(3, len(mismatches))])
}

func runSeqOrderScenario(t *testing.T, broken bool) []string {
	const size, workers, opsEach = 32 << 10, 12, 150
	mem := blockdev.NewMem(size)
	_, addr := startServer(t, &testHandler{Device: &jitterDev{Device: mem, maxDelay: 200 * time.Microsecond}},
		func(s *Server) { s.unordered = broken })
	c := dial(t, addr, Options{Timeout: 20 * time.Second})
	var calls []*call // by enqueue order, i.e. seq order
	setHook(c, func(cl *call) { calls = append(calls, cl) })

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range opsEach {
				off := rng.IntN(size)
				n := 1 + rng.IntN(min(size-off, 8<<10))
				var err error
				switch rng.IntN(7) {
				case 0, 1, 2:
					p := make([]byte, n)
					for i := range p {
						p[i] = byte(rng.Uint32())
					}
					_, err = c.WriteAt(p, int64(off))
				case 3:
					err = c.WriteZeroes(int64(off), int64(n))
				default:
					_, err = c.ReadAt(make([]byte, n), int64(off))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// Replay in seq order. Every call has completed, so its buffers are
	// stable and the hook is done appending.
	c.mu.Lock()
	defer c.mu.Unlock()
	require.True(t, slices.IsSortedFunc(calls, func(a, b *call) int { return cmp.Compare(a.hdr.Seq, b.hdr.Seq) }))
	var mismatches []string
	model := make([]byte, size)
	for _, cl := range calls {
		off, n := int(cl.hdr.Offset), int(cl.hdr.Length)
		switch cl.hdr.Op {
		case OpWrite:
			copy(model[off:], cl.payload)
		case OpWriteZeroes:
			clear(model[off : off+n])
		case OpRead:
			if !bytes.Equal(cl.dst, model[off:off+n]) {
				mismatches = append(mismatches, fmt.Sprintf("read seq %d at %d+%d differs from the seq-order replay", cl.hdr.Seq, off, n))
			}
		}
	}
	final := make([]byte, size)
	_, err := mem.ReadAt(final, 0)
	require.NoError(t, err)
	if !bytes.Equal(final, model) {
		mismatches = append(mismatches, "final device content differs from the seq-order replay")
	}
	return mismatches
}
