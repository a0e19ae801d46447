package replica

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Discarded blocks: what a trim gives back once a snapshot is deleted.
//
// A user writes 64 MiB, takes a snapshot, deletes the files and trims. The
// data lives in the snapshot, so the trim cannot free it: a head block a
// lower layer holds is never dropped (that would reveal older data). Once
// the snapshot is deleted it becomes a removed snapshot under the head,
// and its blocks the user trimmed are garbage nothing can read. So Unmap
// (and WriteZeroes, whose zero block in the head only hides lower data)
// marks such blocks discarded, and a write clears the mark. When a purge
// prunes a removed snapshot s under the head, every discarded block that
// no layer below s holds is freed: s's copy is punched (and its zero mark
// cleared), then the head's copy if it has one (a trimmed block, or the
// zero mark of a write-zeroes, zeromarks.go), and the location map names
// no layer for it, so it reads as zeros. Discarded blocks a layer
// below s holds keep s's copy: freeing it would reveal that older data.
//
// The marks outlive a reopen (discard_store.go); a snapshot starts the new
// head without them, which leaves space unfreed but never changes what a
// kept snapshot reads (applying them would zero its trimmed blocks). Every replica
// gets the same trims at the same point of the write stream, so all mark
// the same blocks. A removed snapshot emptied by a prune no longer sits
// between the head and its parent: it is dropped at once.

// punchHeld frees the head's blocks in [b, e); the caller holds the
// exclusive lock and knows no lower layer holds them.
func (r *Replica) punchHeld(b, e int64) error {
	for b < e {
		if !r.headHas(b) {
			b = r.headBits.runEnd(b, e, false)
			continue
		}
		end := r.headBits.runEnd(b, e, true)
		if err := r.punchHead(b, end); err != nil {
			return err
		}
		b = end
	}
	return nil
}

// bitmapExtents lists the runs of set bits of m in [0, nblocks) as byte
// extents.
func bitmapExtents(m *bitmap, nblocks int64) []Extent {
	var out []Extent
	for b := int64(0); b < nblocks; {
		if b = m.runEnd(b, nblocks, false); b >= nblocks {
			break
		}
		e := m.runEnd(b, nblocks, true)
		out = append(out, Extent{Offset: b * bs, Length: (e - b) * bs})
		b = e
	}
	return out
}

// unionExtents merges two sorted lists of non-overlapping extents.
func unionExtents(a, b []Extent) []Extent {
	out := make([]Extent, 0, len(a)+len(b))
	add := func(e Extent) {
		if n := len(out); n > 0 && out[n-1].End() >= e.Offset {
			out[n-1].Length = max(out[n-1].End(), e.End()) - out[n-1].Offset
			return
		}
		out = append(out, e)
	}
	for len(a) > 0 || len(b) > 0 {
		if len(b) == 0 || (len(a) > 0 && a[0].Offset <= b[0].Offset) {
			add(a[0])
			a = a[1:]
		} else {
			add(b[0])
			b = b[1:]
		}
	}
	return out
}

// intersectExtents returns what both sorted lists cover.
func intersectExtents(a, b []Extent) []Extent { return subtractExtents(a, subtractExtents(a, b)) }

// extentsFunc lists a layer's data: scanExtents always reads the file, a
// purge's choice (what it frees must be exact); Chain's report reads
// through the cache.
type extentsFunc func(l *layer, size int64) ([]Extent, error)

func scanExtents(l *layer, size int64) ([]Extent, error) {
	exts, err := dataExtents(l.f, size)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", l.file, err)
	}
	return exts, nil
}

// heldBelow lists what every layer under s holds (data and zero marks),
// the backing file included. The caller holds opMu or the I/O lock, so the
// chain does not change.
func (r *Replica) heldBelow(s *layer, size int64, extents extentsFunc) ([]Extent, error) {
	chain, err := r.chainBelow(s.meta.Parent)
	if err != nil {
		return nil, err
	}
	var all []Extent
	for _, l := range chain {
		exts, err := heldExtents(l, size, extents)
		if err != nil {
			return nil, err
		}
		all = unionExtents(all, exts)
	}
	return all, nil
}

// prunePlan is what a prune of s frees: punch, s's data blocks the head
// holds (data or zero mark) or discarded; unmark, s's zero marks over such
// blocks or over blocks no layer below s holds (they hide nothing); free,
// the blocks that then read from no layer under the head (those punched or
// unmarked that nothing below s holds, and the discarded ones nothing
// below s holds); discarded, the latter, whose head copies go too.
type prunePlan struct {
	punch, unmark, free, discarded []Extent
}

// planPrune reads s's data, the data below it and the head's maps.
func (r *Replica) planPrune(s *layer, size int64) (prunePlan, error) {
	// Writers share the read lock and set a block's head bit before they
	// clear its mark, so reading the marks first sees every block in one
	// of the two: a write racing the reads cannot hide its block from both.
	r.mu.RLock()
	discarded := bitmapExtents(r.discarded, size/bs)
	held := bitmapExtents(r.headBits, size/bs)
	r.mu.RUnlock()
	return r.prunable(s, size, held, discarded, scanExtents)
}

// prunable is what a prune of s would do given the head's blocks (held)
// and its discarded blocks; Chain's exclusive bytes are its punch.
func (r *Replica) prunable(s *layer, size int64, held, discarded []Extent, extents extentsFunc) (prunePlan, error) {
	data, err := extents(s, size)
	if err != nil {
		return prunePlan{}, fmt.Errorf("prune %s: %w", s.file, err)
	}
	marks := markExtents(s, size)
	below, err := r.heldBelow(s, size, extents)
	if err != nil {
		return prunePlan{}, fmt.Errorf("prune %s: %w", s.file, err)
	}
	discarded = subtractExtents(discarded, below)
	gone := unionExtents(held, discarded)
	punch := intersectExtents(data, gone)
	// A mark can go where the block is gone from s, or where it hides
	// nothing; one over data that stays is harmless either way.
	unmark := subtractExtents(marks, subtractExtents(below, gone))
	kept := unionExtents(subtractExtents(data, punch), subtractExtents(marks, unmark))
	return prunePlan{
		punch:     punch,
		unmark:    unmark,
		free:      unionExtents(subtractExtents(subtractExtents(unionExtents(data, marks), kept), below), discarded),
		discarded: discarded,
	}, nil
}

// settlePrune runs once s's punches are durable: blocks still discarded
// lose their head copy, and no freed block names a layer any more. Under
// the exclusive lock, so no write slips between the check and the punch.
func (r *Replica) settlePrune(p prunePlan) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range p.discarded {
		for b, stop := e.Offset/bs, e.End()/bs; b < stop; {
			if !r.discarded.has(b) {
				b = r.discarded.runEnd(b, stop, false)
				continue
			}
			end := r.discarded.runEnd(b, stop, true)
			if err := r.punchHeld(b, end); err != nil {
				return fmt.Errorf("prune: %w", err)
			}
			r.discarded.clear(b, end)
			r.persistDiscarded(b, end)
			b = end
		}
	}
	for _, e := range p.free {
		r.owner.fill(e.Offset/bs, e.End()/bs, 0)
	}
	return nil
}

// dropEmptyUnderHead takes removed snapshot s, which holds no data any
// more, from under the head: the head's .meta names s's parent, then
// volume.meta drops s. A crash in between leaves s a removed leaf that
// Open keeps and the next purge deletes; either way the volume reads the
// same, since s held nothing.
func (r *Replica) dropEmptyUnderHead(s *layer, size int64) error {
	chain, err := r.chainBelow(s.meta.Parent)
	if err != nil {
		return err
	}
	owner, err := buildOwnerMap(chain, size)
	if err != nil {
		return err
	}
	m := r.head.meta
	m.Parent = s.meta.Parent
	if err := writeLayerMeta(r.dir, r.head.file, m); err != nil {
		return fmt.Errorf("take %s from under the head: %w", s.file, err)
	}
	if err := syncDir(r.dir); err != nil {
		return fmt.Errorf("take %s from under the head: %w", s.file, err)
	}
	crashPoint("prune:reparented")
	r.mu.Lock()
	r.head.meta = m
	r.owner = owner
	r.mu.Unlock()
	return r.dropSnapshot(s, true)
}

// isEmpty reports whether l holds nothing below size: no data, no marks.
func isEmpty(l *layer, size int64) (bool, error) {
	if len(markExtents(l, size)) > 0 {
		return false, nil
	}
	off, err := unix.Seek(int(l.f.Fd()), 0, unix.SEEK_DATA)
	if err == unix.ENXIO {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("SEEK_DATA in %s: %w", l.file, err)
	}
	return off >= size, nil
}

// extentCache keeps a snapshot layer's data extents between Chain calls:
// SEEK_DATA over every layer on every size report would be a scan of the
// whole chain each time. An entry is valid while the file's allocated
// blocks and change time are what they were when it was read; a punch or
// a copy into the layer changes both.
type extentCache struct {
	mu      sync.Mutex
	byLayer map[*layer]cachedExtents
}

type cachedExtents struct {
	ino    uint64
	blocks int64
	ctime  unix.Timespec
	exts   []Extent
}

func (c *extentCache) extents(l *layer, size int64) ([]Extent, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(l.f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", l.file, err)
	}
	c.mu.Lock()
	e, ok := c.byLayer[l]
	c.mu.Unlock()
	if ok && e.ino == st.Ino && e.blocks == st.Blocks && e.ctime == st.Ctim {
		return e.exts, nil
	}
	exts, err := scanExtents(l, size)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.byLayer == nil {
		c.byLayer = map[*layer]cachedExtents{}
	}
	c.byLayer[l] = cachedExtents{ino: st.Ino, blocks: st.Blocks, ctime: st.Ctim, exts: exts}
	c.mu.Unlock()
	return exts, nil
}

// forget drops the entries of layers no longer in the chain.
func (c *extentCache) forget(keep func(*layer) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for l := range c.byLayer {
		if !keep(l) {
			delete(c.byLayer, l)
		}
	}
}

// exclusiveBytes is what deleting snapshot s would free now, by the
// purge's rules (nextPurgeStep): a leaf, its whole layer; one snapshot
// child, s's data blocks the child holds (the child's win in the merge);
// the head as only child, what a prune punches; several children, nothing.
// Zero marks cost no data bytes. The caller holds the I/O lock (shared is
// enough: head blocks written meanwhile only add to it).
func (r *Replica) exclusiveBytes(s *layer) (int64, error) {
	snaps, head := r.children(s.meta.Name)
	switch {
	case len(snaps) == 0 && !head:
		return r.layerAllocated(s)
	case len(snaps) == 1 && !head:
		exts, err := r.exts.extents(s, r.size)
		if err != nil {
			return 0, err
		}
		cExts, err := heldExtents(snaps[0], r.size, r.exts.extents)
		if err != nil {
			return 0, err
		}
		return extentBytes(intersectExtents(exts, cExts)), nil
	case len(snaps) == 0 && head:
		nblocks := r.size / bs
		plan, err := r.prunable(s, r.size, bitmapExtents(r.headBits, nblocks), bitmapExtents(r.discarded, nblocks),
			r.exts.extents)
		return extentBytes(plan.punch), err
	}
	return 0, nil
}
