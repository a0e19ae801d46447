package backupstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"sync"
)

// blob is one compressed chunk on its way into a pack.
type blob struct {
	id    ChunkID
	data  []byte
	rlen  int
	codec Codec
	// readBuf, when set, is the worker's read buffer data points into (a
	// raw chunk is packed from it, not copied first); the packer gives it
	// back to the pool once the chunk is in the pack.
	readBuf *[]byte
}

// upload reads, hashes and compresses the chunks toRead on b.workers
// goroutines, packs new chunks on one goroutine and uploads sealed packs on
// b.uploaders goroutines. Every channel is bounded, so memory is too (see
// newBackupRun); the first error cancels the rest.
func (b *backupRun) upload(ctx context.Context, toRead []int64) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan int64)
	blobs := make(chan blob, b.workers)
	packs := make(chan *sealedPack)

	go func() {
		defer close(jobs)
		for _, i := range toRead {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	// Read buffers: one per worker and queued blob, and those of the packs
	// being built, waiting and uploading, as newBackupRun counts them.
	perPack := int(b.t.format.PackSize/b.hdr.ChunkSize) + 1
	b.readBufs = newBufferList(2*b.workers+(b.uploaders+2)*perPack, int(b.hdr.ChunkSize))
	var workers sync.WaitGroup
	for range b.workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			// The worker's own buffer for compressed samples: one fresh each
			// chunk was 64 MiB of garbage per GiB, zeroed and faulted in anew.
			var sample []byte
			for i := range jobs {
				if err := b.chunk(ctx, i, &sample, blobs); err != nil {
					cancel(err)
				}
			}
		}()
	}
	go func() { workers.Wait(); close(blobs) }()
	go b.pack(ctx, blobs, packs)
	var uploaders sync.WaitGroup
	for range b.uploaders {
		uploaders.Add(1)
		go func() {
			defer uploaders.Done()
			for p := range packs {
				if ctx.Err() != nil {
					continue // drain so the packer can finish
				}
				if err := b.putPack(ctx, p); err != nil {
					cancel(err)
				}
			}
		}()
	}
	uploaders.Wait()
	return context.Cause(ctx)
}

// chunk handles one chunk: read, skip zeroes, hash, dedupe, compress.
func (b *backupRun) chunk(ctx context.Context, i int64, sample *[]byte, out chan<- blob) error {
	if ctx.Err() != nil {
		return nil
	}
	buf := b.readBufs.get()
	handedOn := false
	defer func() {
		if !handedOn {
			b.readBufs.put(buf)
		}
	}()
	off, n := i*b.hdr.ChunkSize, b.hdr.chunkLen(i)
	raw := (*buf)[:n]
	if got, err := b.in.Source.ReadAt(raw, off); got < len(raw) || (err != nil && err != io.EOF) {
		return fmt.Errorf("read chunk %d (offset %d) of snapshot %s: %d of %d bytes: %v", i, off, b.in.Snapshot, got, n, err)
	}
	b.progress(n)
	if bytes.Equal(raw, b.t.zero[:n]) {
		b.slots[i] = slot{} // all-zero chunks are holes, never stored
		return nil
	}
	id := ChunkID(sha256.Sum256(raw))
	b.slots[i] = slot{kind: KindData, id: id} // each worker writes only its own i
	if b.t.index.has(id) || !b.claim(id) {
		return nil
	}
	bl := blob{id: id, rlen: int(n)}
	if c, ok := b.t.compressed(raw, sample); ok {
		bl.data, bl.codec = c, CodecZstd
	} else {
		bl.data, bl.codec, bl.readBuf = raw, CodecRaw, buf
	}
	select {
	case out <- bl:
		handedOn = bl.readBuf != nil
	case <-ctx.Done():
	}
	return nil
}

// bufferList is a free list of equal buffers. Not a sync.Pool: every GC
// empties one, and a backup runs a GC every few packs; a fresh 1 MiB
// buffer is zeroed and faulted in page by page.
type bufferList struct {
	free chan *[]byte
	size int
}

func newBufferList(keep, size int) *bufferList {
	return &bufferList{free: make(chan *[]byte, keep), size: size}
}

func (l *bufferList) get() *[]byte {
	select {
	case b := <-l.free:
		return b
	default:
		b := make([]byte, l.size)
		return &b
	}
}

// put keeps b for reuse, or drops it when enough are kept.
func (l *bufferList) put(b *[]byte) {
	select {
	case l.free <- b:
	default:
	}
}

// compressSample is how much of a chunk is tried first: a chunk whose
// first compressSample bytes zstd cannot shrink (random or already
// compressed data, the common case for incompressible chunks) is stored
// raw without compressing the rest, a sixteenth of the CPU for such data.
const compressSample = 64 << 10

// compressed is raw compressed with zstd, when that saves at least 1/64
// of it; else raw is stored as is (random or already compressed data then
// costs no decompression on restore). sample is the caller's scratch
// buffer for the sample's compressed form.
func (t *Target) compressed(raw []byte, sample *[]byte) ([]byte, bool) {
	if len(raw) > 2*compressSample {
		*sample = t.enc.EncodeAll(raw[:compressSample], (*sample)[:0])
		if !worthCompressing(*sample, compressSample) {
			return nil, false
		}
	}
	c := t.enc.EncodeAll(raw, make([]byte, 0, len(raw)))
	return c, worthCompressing(c, len(raw))
}

// worthCompressing: the compressed form saves at least 1/64 of n bytes.
func worthCompressing(compressed []byte, n int) bool { return len(compressed) < n-n/64 }

// pack appends blobs to a pack and hands each sealed pack to the uploaders
// before it would exceed the target pack size.
func (b *backupRun) pack(ctx context.Context, blobs <-chan blob, out chan<- *sealedPack) {
	defer close(out)
	var pb *packBuilder
	send := func() {
		if pb == nil || len(pb.entries) == 0 {
			return
		}
		select {
		case out <- pb.seal():
		case <-ctx.Done():
		}
		pb = nil
	}
	for bl := range blobs {
		if ctx.Err() != nil {
			continue // drain so the workers can finish
		}
		if pb != nil && int64(pb.size+len(bl.data)) > b.t.format.PackSize {
			send()
		}
		if pb == nil {
			pb = newPackBuilder()
		}
		pb.add(bl.id, bl.data, bl.rlen, bl.codec, bl.readBuf)
	}
	if ctx.Err() == nil {
		send()
	}
}

// putPack uploads a pack, then its index object: an index object never
// names a pack that is not wholly stored. Only then may other backups (of
// this process, through the cache) dedupe onto it.
func (b *backupRun) putPack(ctx context.Context, p *sealedPack) error {
	if err := b.t.store.Put(ctx, packKey(p.id), newSegmentReader(p.segs), p.size); err != nil {
		return fmt.Errorf("upload pack %s: %w", p.id, err)
	}
	if err := b.t.store.Put(ctx, indexKey(p.id), bytes.NewReader(p.index), int64(len(p.index))); err != nil {
		return fmt.Errorf("upload index of pack %s: %w", p.id, err)
	}
	b.mu.Lock()
	for _, e := range p.entries {
		b.uploaded[e.ID] = uploadedChunk{pack: p.id, e: e}
		b.stats.NewChunks++
		b.stats.NewBytes += int64(e.CLen)
	}
	b.stats.NewPacks++
	b.ourPacks[p.id] = true
	b.mu.Unlock()
	b.t.index.add(p.id, p.entries)
	// Only now, the upload done: an HTTP transport may still read a
	// request's body after a failed round trip returns.
	for _, buf := range p.bufs {
		b.readBufs.put(buf)
	}
	return nil
}
