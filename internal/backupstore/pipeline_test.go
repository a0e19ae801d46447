package backupstore

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A chunk is stored compressed only when that saves a 64th of it; a chunk
// whose first 64 KiB do not compress is stored raw without compressing the
// rest (the price: a chunk random at its start and compressible after it
// is stored raw too).
func TestCompressChoosesTheCodec(t *testing.T) {
	random := func(n int) []byte {
		b := make([]byte, n)
		r := rand.New(rand.NewPCG(7, 7))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	text := bytes.Repeat([]byte("strata keeps every volume as a chain of snapshot layers. "), 1<<20/57+1)[:1<<20]
	randomThenText := append(random(compressSample), text[compressSample:]...)
	tgt := newEnv(t, 0).tgt
	for _, tc := range []struct {
		name string
		raw  []byte
		want Codec
	}{
		{"random 1 MiB chunk", random(1 << 20), CodecRaw},
		{"text 1 MiB chunk", text, CodecZstd},
		{"random start, text after: the sample decides", randomThenText, CodecRaw},
		{"small text chunk (no sample)", text[:100<<10], CodecZstd},
		{"small random chunk", random(100 << 10), CodecRaw},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sample []byte
			data, ok := tgt.compressed(tc.raw, &sample)
			assert.Equal(t, tc.want == CodecZstd, ok)
			if !ok {
				return
			}
			assert.Less(t, len(data), len(tc.raw))
			back, err := tgt.dec.DecodeAll(data, make([]byte, 0, len(tc.raw))) // capped as a restore caps it
			assert.NoError(t, err)
			assert.Equal(t, tc.raw, back)
		})
	}
}

// overlapDst records how many WriteAt calls run at once; each call waits
// (up to a bound) for a second one to overlap it.
type overlapDst struct {
	memDst
	active, most atomic.Int32
	overlapped   chan struct{}
	once         sync.Once
}

func (d *overlapDst) WriteAt(p []byte, off int64) (int, error) {
	n := d.active.Add(1)
	defer d.active.Add(-1)
	for m := d.most.Load(); n > m && !d.most.CompareAndSwap(m, n); m = d.most.Load() {
	}
	if n >= 2 {
		d.once.Do(func() { close(d.overlapped) })
	}
	select {
	case <-d.overlapped:
	case <-time.After(5 * time.Second):
	}
	return d.memDst.WriteAt(p, off)
}

// With ParallelWrites chunk writes run at the same time (an engine takes
// concurrent writes): those of several fetch workers, and those of one
// fetch; the data restored is the backup's.
func TestRestoreWritesInParallelWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		packSize             int64
		workers              int
		maxFetch             int64
		wantParallelFetchers bool
	}{
		{"several fetch workers, a chunk per fetch", 2 * testChunk, 4, testChunk, true},
		{"one fetch worker, every chunk in one fetch", 16 * testChunk, 1, 16 * testChunk, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.packSize)
			data := volume(11, 12*testChunk)
			m := e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: int64(len(data)), Source: bytes.NewReader(data)})
			require.Equal(t, tc.wantParallelFetchers, len(planFetches(m, tc.maxFetch)) > 1)
			d := &overlapDst{memDst: memDst{buf: make([]byte, m.VolumeSize)}, overlapped: make(chan struct{})}
			require.NoError(t, e.tgt.Restore(context.Background(), m, d, nil,
				RestoreOptions{Concurrency: tc.workers, MaxFetch: tc.maxFetch, ParallelWrites: true}))
			assert.GreaterOrEqual(t, d.most.Load(), int32(2), "two chunk writes ran at once")
			assert.Equal(t, data, d.buf)
		})
	}
}
