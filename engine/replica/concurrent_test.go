package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrentIO runs writers on disjoint, deliberately unaligned regions
// (neighbours share edge blocks) while snapshots are taken, removed and
// purged, and the chain and the layers' extents (zero marks included) are
// read as the size reports and a rebuild do; every reader checks its own
// region. Run it with -race.
func TestConcurrentIO(t *testing.T) {
	const workers, region, iters = 4, 300_000 + 123, 1500
	r, _ := newReplica(t, (workers*region+bs-1)/bs)
	var wg sync.WaitGroup
	errs := make(chan error, workers+2)
	models := make([][]byte, workers)
	for w := range workers {
		models[w] = make([]byte, region)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			base, model := int64(w*region), models[w]
			for i := range iters {
				off := rng.Int64N(region - 1)
				length := 1 + rng.Int64N(min(region-off, 3*bs))
				switch rng.IntN(5) {
				case 0:
					if err := r.WriteZeroes(base+off, length); err != nil {
						errs <- err
						return
					}
					clear(model[off : off+length])
				case 1, 2:
					p := make([]byte, length)
					fillRandom(p, rng.Uint64())
					if _, err := r.WriteAt(p, base+off); err != nil {
						errs <- err
						return
					}
					copy(model[off:], p)
				default:
					p := make([]byte, length)
					if _, err := r.ReadAt(p, base+off); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(p, model[off:off+length]) {
						errs <- fmt.Errorf("worker %d iteration %d: read %d+%d differs", w, i, off, length)
						return
					}
				}
			}
		}()
	}
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }()
	reporterDone := make(chan struct{})
	go func() {
		defer close(reporterDone)
		for {
			select {
			case <-workersDone:
				return
			default:
			}
			info, err := r.Chain()
			if err != nil {
				errs <- err
				return
			}
			for _, l := range info.Layers {
				if _, err := r.Extents(l.Name); err != nil && !errors.Is(err, ErrSnapshotNotFound) {
					errs <- err
					return
				}
			}
		}
	}()
	structural := 0
	for i := 0; ; i++ {
		select {
		case <-workersDone:
		default:
			name := fmt.Sprintf("s%d", i)
			err := r.Snapshot(name, SnapshotOptions{})
			if err == nil && i > 0 {
				err = r.RemoveSnapshot(fmt.Sprintf("s%d", i-1))
			}
			if err == nil && i%3 == 0 {
				err = r.Purge(context.Background(), nil)
			}
			if err == nil {
				err = r.Flush()
			}
			if err == nil {
				_, err = r.Chain()
			}
			require.NoError(t, err)
			structural++
			continue
		}
		break
	}
	t.Logf("%d snapshot/remove/purge rounds during the I/O", structural)
	<-reporterDone
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	all := readAll(t, r)
	for w := range workers {
		assert.True(t, bytes.Equal(models[w], all[w*region:(w+1)*region]), "worker %d region", w)
	}
	require.NoError(t, r.Purge(context.Background(), nil))
	assert.True(t, bytes.Equal(all, readAll(t, r)))
}
