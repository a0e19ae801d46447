package replica

// The per-block records an importing replica keeps of writes, trims and
// zeroes it could not apply the way the source did, and their resolution
// against the imported chain at commit (see import.go).

import (
	"fmt"
	"math/bits"
)

// span is a byte range [lo, hi) inside one block.
type span struct{ lo, hi uint16 }

// byteSet is a sorted list of disjoint, non-adjacent spans.
type byteSet []span

func (s byteSet) add(lo, hi int64) byteSet {
	n := span{uint16(lo), uint16(hi)}
	out := make(byteSet, 0, len(s)+1)
	i := 0
	for ; i < len(s) && s[i].hi < n.lo; i++ {
		out = append(out, s[i])
	}
	for ; i < len(s) && s[i].lo <= n.hi; i++ {
		n.lo, n.hi = min(n.lo, s[i].lo), max(n.hi, s[i].hi)
	}
	return append(append(out, n), s[i:]...)
}

func (s byteSet) full() bool { return len(s) == 1 && s[0].lo == 0 && s[0].hi == bs }

// overlay copies the bytes of s from src into dst (both one block).
func (s byteSet) overlay(dst, src []byte) {
	for _, sp := range s {
		copy(dst[sp.lo:sp.hi], src[sp.lo:sp.hi])
	}
}

// blockRec is what an import must remember about one head block beyond
// "the head holds it whole". Zero value: nothing.
type blockRec struct {
	tainted  bool
	valid    byteSet // tainted: the bytes written since the head took the block
	unmapped bool
	since    byteSet // unmapped: the bytes written since the (last) unmap
}

// importMarked reports whether any block of [b, e) has import state that a
// write must update, which the lock-free write path cannot do. The caller
// holds the I/O lock (shared is enough).
func (r *Replica) importMarked(b, e int64) bool {
	imp := r.imp
	if imp == nil {
		return false
	}
	for _, w := range []*bitmap{imp.recBits, imp.unmapped, imp.zeroed} {
		if w.runEnd(b, e, false) < e {
			return true
		}
	}
	return false
}

func (imp *importState) rec(b int64) *blockRec {
	if rec := imp.recs[b]; rec != nil {
		return rec
	}
	if len(imp.recs) >= maxImportRecords {
		if imp.err == nil {
			imp.err = fmt.Errorf("more than %d partly written blocks during the import", maxImportRecords)
		}
		return &blockRec{} // not kept: the commit will fail
	}
	rec := &blockRec{}
	imp.recs[b] = rec
	imp.recBits.set(b, b+1)
	return rec
}

// settle drops a record that no longer says anything.
func (imp *importState) settle(b int64, rec *blockRec) {
	if rec.tainted && rec.valid.full() {
		rec.tainted, rec.valid = false, nil
	}
	if rec.unmapped && rec.since.full() {
		rec.unmapped, rec.since = false, nil
	}
	if !rec.tainted && !rec.unmapped {
		imp.forget(b, b+1)
	}
}

// forget drops every record of [b, e) and the bits.
func (imp *importState) forget(b, e int64) {
	for b < e {
		b = imp.recBits.runEnd(b, e, false)
		if b >= e {
			break
		}
		end := imp.recBits.runEnd(b, e, true)
		if end-b < int64(len(imp.recs)) {
			for x := b; x < end; x++ {
				delete(imp.recs, x)
			}
		} else {
			for x := range imp.recs {
				if x >= b && x < end {
					delete(imp.recs, x)
				}
			}
		}
		imp.recBits.clear(b, end)
		b = end
	}
}

// wholeBlocks forgets everything about [b, e): they were written whole.
func (imp *importState) wholeBlocks(b, e int64) {
	imp.forget(b, e)
	imp.unmapped.clear(b, e)
	imp.zeroed.clear(b, e)
}

// noteWrite updates the records for a write of [off, end) that is about to
// be applied by writeLocked; the caller holds the exclusive lock, and head
// bits still say what the head held before the write.
func (r *Replica) noteImportWrite(off, end int64) {
	imp := r.imp
	first, last := off/bs, (end-1)/bs
	partial := func(b int64) {
		bstart := b * bs
		lo, hi := max(off, bstart)-bstart, min(end, bstart+bs)-bstart
		if lo == 0 && hi == bs {
			imp.wholeBlocks(b, b+1)
			return
		}
		if imp.zeroed.has(b) {
			// The head lacks it and T has nothing below: the write fills the
			// rest with zeros, which is the block's content on S too.
			imp.zeroed.clear(b, b+1)
			return
		}
		var rec *blockRec
		if imp.recBits.has(b) {
			rec = imp.recs[b]
		}
		if !r.headHas(b) {
			// Read-modify-write from layers T does not have yet.
			if rec == nil {
				rec = imp.rec(b)
			}
			rec.tainted, rec.valid = true, nil
		}
		if imp.unmapped.has(b) {
			imp.unmapped.clear(b, b+1)
			if rec == nil {
				rec = imp.rec(b)
			}
			rec.unmapped, rec.since = true, nil
		}
		if rec == nil {
			return
		}
		if rec.tainted {
			rec.valid = rec.valid.add(lo, hi)
		}
		if rec.unmapped {
			rec.since = rec.since.add(lo, hi)
		}
		imp.settle(b, rec)
	}
	partial(first)
	if last != first {
		partial(last)
	}
	if first+1 < last {
		imp.wholeBlocks(first+1, last)
	}
}

// noteImportUnmap records a trim of the whole blocks [b, e) instead of
// punching them. Blocks the head lacks read the same on T and S whatever
// the lower layers, so only head blocks are marked.
func (r *Replica) noteImportUnmap(b, e int64) {
	imp := r.imp
	for b < e {
		b = r.headBits.runEnd(b, e, false)
		if b >= e {
			break
		}
		end := r.headBits.runEnd(b, e, true)
		imp.unmapped.set(b, end)
		for x := b; x < end; {
			x = imp.recBits.runEnd(x, end, false)
			if x >= end {
				break
			}
			rend := imp.recBits.runEnd(x, end, true)
			for ; x < rend; x++ {
				if rec := imp.recs[x]; rec != nil {
					rec.unmapped, rec.since = false, nil
					if !rec.tainted {
						imp.forget(x, x+1)
					}
				}
			}
		}
		b = end
	}
}

// importZeroes makes the whole blocks [b, e) read as zeros during an import.
func (r *Replica) importZeroes(b, e int64) error {
	imp := r.imp
	if b >= e {
		return nil
	}
	imp.wholeBlocks(b, e)
	if imp.noFree {
		// A lower layer (the backing file) may hold the blocks: zero marks
		// hide it whatever the imported layers hold.
		return r.markHeadZeros(b, e)
	}
	for x := b; x < e; {
		x = r.headBits.runEnd(x, e, false)
		if x >= e {
			break
		}
		end := r.headBits.runEnd(x, e, true)
		if err := r.punchHead(x, end); err != nil {
			return err
		}
		x = end
	}
	imp.zeroed.set(b, e)
	return nil
}

// importFixer resolves an import's records against the imported location
// map: afterwards every head block holds what S's head holds.
type importFixer struct {
	r     *Replica
	imp   *importState
	owner *ownerMap
	lower map[uint16]*layer
	buf   []byte // two blocks
	mark  Extent // blocks to zero-mark in the head (in blocks), see block
}

// fixBatch bounds the blocks one hold of the I/O lock resolves in the
// pre-pass, so that writes are never stopped for long.
const fixBatch = 256

// prepass resolves what exists now in batches, each under the exclusive
// lock; what writes create meanwhile is left for all.
func (f *importFixer) prepass() error {
	r := f.r
	r.mu.RLock()
	cands := f.candidates()
	r.mu.RUnlock()
	for len(cands) > 0 {
		n := 0
		var batch []Extent
		for n < fixBatch && len(cands) > 0 {
			e := cands[0]
			take := min(e.Length, int64(fixBatch-n))
			batch = append(batch, Extent{Offset: e.Offset, Length: take})
			n += int(take)
			if take == e.Length {
				cands = cands[1:]
			} else {
				cands[0] = Extent{Offset: e.Offset + take, Length: e.Length - take}
			}
		}
		r.mu.Lock()
		err := f.resolve(batch)
		r.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// all resolves everything left; the caller holds the exclusive lock.
func (f *importFixer) all() error { return f.resolve(f.candidates()) }

// candidates lists the marked blocks as runs (Offset and Length in blocks).
func (f *importFixer) candidates() []Extent {
	imp := f.imp
	var out []Extent
	for pg := range imp.recBits.pages {
		rec, unm, zer := imp.recBits.pages[pg].Load(), imp.unmapped.pages[pg].Load(), imp.zeroed.pages[pg].Load()
		if rec == nil && unm == nil && zer == nil {
			continue
		}
		for j := range int64(pageWords) {
			for w := rec.word(j) | unm.word(j) | zer.word(j); w != 0; w &= w - 1 {
				b := int64(pg)<<pageShift + j*64 + int64(bits.TrailingZeros64(w))
				if n := len(out); n > 0 && out[n-1].End() == b {
					out[n-1].Length++
					continue
				}
				out = append(out, Extent{Offset: b, Length: 1})
			}
		}
	}
	return out
}

// resolve settles the blocks of runs (in blocks) under the exclusive lock.
func (f *importFixer) resolve(runs []Extent) error {
	for _, e := range runs {
		for b := e.Offset; b < e.End(); b++ {
			if err := f.block(b); err != nil {
				return err
			}
		}
	}
	return f.flushMarks()
}

// markLater queues head block b for a zero mark; runs are marked at once,
// since each mark stores a whole page of the marks file.
func (f *importFixer) markLater(b int64) error {
	if f.mark.Length > 0 && f.mark.End() == b {
		f.mark.Length++
		return nil
	}
	err := f.flushMarks()
	f.mark = Extent{Offset: b, Length: 1}
	return err
}

func (f *importFixer) flushMarks() error {
	m := f.mark
	f.mark = Extent{}
	if m.Length == 0 {
		return nil
	}
	return f.r.markHeadZeros(m.Offset, m.End())
}

// block settles one block: its content becomes what S's head holds, given
// that S's lower layers are f.owner.
func (f *importFixer) block(b int64) error {
	r, imp := f.r, f.imp
	lowerData := f.owner.get(b) != 0
	var rec *blockRec
	if imp.recBits.has(b) {
		rec = imp.recs[b]
	}
	unmapped, zeroed := imp.unmapped.has(b), imp.zeroed.has(b)
	imp.unmapped.clear(b, b+1)
	imp.zeroed.clear(b, b+1)
	imp.forget(b, b+1)
	switch {
	case zeroed:
		// Freed by WriteZeroes: S zero-marked the block where a lower layer
		// holds it (and freed it otherwise).
		if lowerData {
			return f.markLater(b)
		}
	case unmapped && !lowerData:
		// S freed the block: it reads zeros.
		return r.punchHead(b, b+1)
	case rec != nil && rec.unmapped && !lowerData:
		// S freed it, then took partial writes on zeros.
		out, head := f.buf[:bs], f.buf[bs:]
		clear(out)
		if err := readFull(r.head.f, head, b*bs); err != nil {
			return err
		}
		rec.since.overlay(out, head)
		return f.writeHead(b, out)
	case rec != nil && rec.tainted && lowerData:
		// The head's first write here was partial: the rest comes from below.
		out, head := f.buf[:bs], f.buf[bs:]
		if err := readFull(f.lower[f.owner.get(b)].f, out, b*bs); err != nil {
			return err
		}
		if err := readFull(r.head.f, head, b*bs); err != nil {
			return err
		}
		rec.valid.overlay(out, head)
		return f.writeHead(b, out)
	}
	// Otherwise the head (or its absence) already reads as on S: a taint
	// over no lower data was filled with zeros, and a trim over lower data
	// is one S did not act on either.
	return nil
}

func (f *importFixer) writeHead(b int64, p []byte) error {
	r := f.r
	if _, err := r.head.f.WriteAt(p, b*bs); err != nil {
		return fmt.Errorf("write %s at %d: %w", r.head.file, b*bs, err)
	}
	r.headBits.set(b, b+1)
	return nil
}
