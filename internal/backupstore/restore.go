package backupstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"

	"golang.org/x/sync/errgroup"
)

// ChunkError names a chunk that failed to restore or verify: the backup,
// the chunk and its volume offset, its id and the pack that should hold it.
type ChunkError struct {
	Volume, Backup string
	Index, Offset  int64
	Chunk          ChunkID
	Pack           PackID
	Err            error
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("backup %s of volume %s: chunk %d (offset %d, id %s) in pack %s: %v",
		e.Backup, e.Volume, e.Index, e.Offset, e.Chunk, e.Pack, e.Err)
}

func (e *ChunkError) Unwrap() error { return e.Err }

// ErrChecksum is the cause of a ChunkError whose bytes do not hash to its id.
var ErrChecksum = errors.New("checksum mismatch")

// RestoreOptions tune Restore.
type RestoreOptions struct {
	// WriteZeroes writes holes as zeroes, for a destination that is not
	// fresh and sparse. It is implied by BackingAlreadyThere: under a
	// backing image a hole must hide the image's bytes.
	WriteZeroes bool
	// BackingAlreadyThere skips KindBacking chunks: the destination is a
	// layer over the same backing image.
	BackingAlreadyThere bool
	Concurrency         int // fetch workers; default 4
	MaxFetch            int64
	// ParallelWrites: dst takes WriteAt calls from several goroutines at
	// once (an engine does), so the fetch workers write without taking
	// turns; a restore is otherwise one chunk write at a time, each
	// waiting for every replica.
	ParallelWrites bool
}

const (
	defaultMaxFetch = 16 << 20 // one ranged GET covers up to this many bytes
	maxFetchGap     = 256 << 10
)

// fetch is one ranged GET: neighbouring chunks of one pack.
type fetch struct {
	pack    uint32
	off     uint64
	end     uint64
	entries []int // into Manifest.Entries
}

// planFetches sorts data entries by pack and offset and merges neighbours
// (gaps up to maxFetchGap, read and discarded) into requests of at most
// maxFetch bytes: a restore costs about one GET per pack, not per chunk.
func planFetches(m *Manifest, maxFetch int64) []fetch {
	var idx []int
	for i, e := range m.Entries {
		if e.Kind == KindData {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(a, b int) bool {
		ea, eb := &m.Entries[idx[a]], &m.Entries[idx[b]]
		if ea.Pack != eb.Pack {
			return ea.Pack < eb.Pack
		}
		return ea.Offset < eb.Offset
	})
	var out []fetch
	for _, i := range idx {
		e := &m.Entries[i]
		end := e.Offset + uint64(e.CLen)
		if n := len(out); n > 0 {
			f := &out[n-1]
			if f.pack == e.Pack && e.Offset >= f.off && e.Offset <= f.end+maxFetchGap && int64(max(end, f.end)-f.off) <= maxFetch {
				f.end = max(f.end, end)
				f.entries = append(f.entries, i)
				continue
			}
		}
		out = append(out, fetch{pack: e.Pack, off: e.Offset, end: end, entries: []int{i}})
	}
	return out
}

// chunkSink receives each verified chunk, or the error that chunk hit.
type chunkSink func(e *Entry, data []byte, err *ChunkError) error

// chunksAtOnce is how many chunks of one fetch are verified and handed to
// the sink at once: a restore's writes then overlap each other (a write
// waits for every replica) and the other workers' GETs, instead of one
// write in flight per fetch worker.
const chunksAtOnce = 4

// readChunks fetches every data chunk of m and verifies it against its id.
func (t *Target) readChunks(ctx context.Context, m *Manifest, workers int, maxFetch int64, sink chunkSink) error {
	fetches := planFetches(m, maxFetch)
	// One fetch buffer per worker, reused: a fresh 16 MiB buffer per GET is
	// zeroed and faulted in page by page.
	bufs := newBufferList(workers, int(maxFetch))
	return parallel(ctx, len(fetches), workers, func(i int) error {
		return t.runFetch(ctx, m, &fetches[i], bufs, sink)
	})
}

func (t *Target) runFetch(ctx context.Context, m *Manifest, f *fetch, bufs *bufferList, sink chunkSink) error {
	pack := m.Packs[f.pack]
	pooled := bufs.get()
	buf, ferr := t.getRange(ctx, packKey(pack), f.off, f.end-f.off, *pooled)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(chunksAtOnce)
	for _, i := range f.entries {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			e := &m.Entries[i]
			var out []byte
			err := ferr
			if err == nil {
				out, err = t.decodeChunk(e, buf[e.Offset-f.off:e.Offset-f.off+uint64(e.CLen)], m.chunkLen(e.Index))
			}
			var ce *ChunkError
			if err != nil {
				ce = &ChunkError{Volume: m.Volume, Backup: m.Backup, Index: e.Index, Offset: e.Index * m.ChunkSize,
					Chunk: e.Chunk, Pack: pack, Err: err}
			}
			return sink(e, out, ce)
		})
	}
	err := g.Wait()
	bufs.put(pooled) // every chunk of it written or dropped
	return err
}

// getRange reads exactly n bytes into buf when it is big enough (else a
// new buffer): a short object is an error, never zeroes.
func (t *Target) getRange(ctx context.Context, key string, off, n uint64, buf []byte) ([]byte, error) {
	rc, err := t.store.GetRange(ctx, key, int64(off), int64(n))
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if uint64(len(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(rc, buf); err != nil {
		return nil, fmt.Errorf("read %s at %d+%d: %w", key, off, n, err)
	}
	return buf, nil
}

func (t *Target) decodeChunk(e *Entry, stored []byte, rlen int64) ([]byte, error) {
	var raw []byte
	switch e.Codec {
	case CodecRaw:
		raw = stored
	case CodecZstd:
		var err error
		raw, err = t.dec.DecodeAll(stored, make([]byte, 0, rlen))
		if err != nil {
			return nil, fmt.Errorf("decompress: %w", err)
		}
	default:
		return nil, fmt.Errorf("unknown codec %d", e.Codec)
	}
	if int64(len(raw)) != rlen {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrChecksum, len(raw), rlen)
	}
	if sha256.Sum256(raw) != e.Chunk {
		return nil, ErrChecksum
	}
	return raw, nil
}

// Restore writes backup m to dst. Every data chunk is checked against its
// SHA-256; the first bad or missing one fails the restore with a
// *ChunkError. backing supplies KindBacking chunks unless
// opts.BackingAlreadyThere.
func (t *Target) Restore(ctx context.Context, m *Manifest, dst io.WriterAt, backing io.ReaderAt, opts RestoreOptions) error {
	if opts.Concurrency <= 0 {
		opts.Concurrency = defaultConcurrency
	}
	if opts.MaxFetch <= 0 {
		opts.MaxFetch = defaultMaxFetch
	}
	if err := t.checkManifest(m); err != nil {
		return err
	}
	if err := t.restoreLocal(ctx, m, dst, backing, opts); err != nil {
		return err
	}
	var mu sync.Mutex // unless opts.ParallelWrites: WriterAt implementations need not be safe for parallel use
	return t.readChunks(ctx, m, opts.Concurrency, opts.MaxFetch, func(e *Entry, data []byte, ce *ChunkError) error {
		if ce != nil {
			return ce
		}
		if !opts.ParallelWrites {
			mu.Lock()
			defer mu.Unlock()
		}
		if _, err := dst.WriteAt(data, e.Index*m.ChunkSize); err != nil {
			return fmt.Errorf("restore backup %s of volume %s: write chunk %d: %w", m.Backup, m.Volume, e.Index, err)
		}
		return nil
	})
}

// restoreLocal writes what needs no pack: backing chunks and, when asked,
// zeroes for holes.
func (t *Target) restoreLocal(ctx context.Context, m *Manifest, dst io.WriterAt, backing io.ReaderAt, opts RestoreOptions) error {
	zeroes := opts.WriteZeroes || opts.BackingAlreadyThere
	wantBacking := !opts.BackingAlreadyThere
	if wantBacking && backing == nil {
		for _, e := range m.Entries {
			if e.Kind == KindBacking {
				return fmt.Errorf("restore backup %s of volume %s: chunk %d is backing image %s data and no backing image was given",
					m.Backup, m.Volume, e.Index, m.backingName())
			}
		}
	}
	buf := make([]byte, m.ChunkSize)
	next := 0
	for i := range m.Chunks() {
		if err := ctx.Err(); err != nil {
			return err
		}
		for next < len(m.Entries) && m.Entries[next].Index < i {
			next++
		}
		kind := EntryKind(0)
		if next < len(m.Entries) && m.Entries[next].Index == i {
			kind = m.Entries[next].Kind
		}
		off, n := i*m.ChunkSize, m.chunkLen(i)
		var data []byte
		switch {
		case kind == KindBacking && wantBacking:
			if got, err := backing.ReadAt(buf[:n], off); got < int(n) {
				return fmt.Errorf("restore backup %s of volume %s: read backing image %s at %d: %v", m.Backup, m.Volume, m.backingName(), off, err)
			}
			data = buf[:n]
		case kind == 0 && zeroes:
			data = t.zero[:n]
		default:
			continue
		}
		if _, err := dst.WriteAt(data, off); err != nil {
			return fmt.Errorf("restore backup %s of volume %s: write chunk %d: %w", m.Backup, m.Volume, i, err)
		}
	}
	return nil
}

func (m *Manifest) backingName() string {
	if m.BackingImage == nil {
		return "(none recorded)"
	}
	return m.BackingImage.Name
}

// VerifyReport is what Verify found.
type VerifyReport struct {
	Chunks int64 // data chunks checked
	Bytes  int64 // their uncompressed bytes
	Bad    []*ChunkError
}

// Verify re-reads every data chunk of m and checks it against its id. It
// returns an error when any chunk is bad; the report lists them all.
func (t *Target) Verify(ctx context.Context, m *Manifest, concurrency int) (*VerifyReport, error) {
	if concurrency <= 0 {
		concurrency = defaultConcurrency
	}
	if err := t.checkManifest(m); err != nil {
		return nil, err
	}
	rep := &VerifyReport{}
	var mu sync.Mutex
	err := t.readChunks(ctx, m, concurrency, defaultMaxFetch, func(e *Entry, data []byte, ce *ChunkError) error {
		mu.Lock()
		defer mu.Unlock()
		rep.Chunks++
		if ce != nil {
			rep.Bad = append(rep.Bad, ce)
			return nil
		}
		rep.Bytes += int64(len(data))
		return nil
	})
	if err != nil {
		return rep, err
	}
	sort.Slice(rep.Bad, func(i, j int) bool { return rep.Bad[i].Index < rep.Bad[j].Index })
	if len(rep.Bad) > 0 {
		return rep, fmt.Errorf("verify backup %s of volume %s: %d of %d chunks bad, first: %w", m.Backup, m.Volume, len(rep.Bad), rep.Chunks, rep.Bad[0])
	}
	return rep, nil
}

func (t *Target) checkManifest(m *Manifest) error {
	if m.ChunkSize != t.format.ChunkSize {
		return fmt.Errorf("backup %s of volume %s: chunk size %d differs from the target's %d", m.Backup, m.Volume, m.ChunkSize, t.format.ChunkSize)
	}
	return nil
}
