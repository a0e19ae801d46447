package replica

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/engine/blockdev"
)

// zeroBuf is zeros for the partial blocks of WriteZeroes and for
// comparisons. Never modified.
var zeroBuf = make([]byte, 1<<20)

func (r *Replica) headHas(b int64) bool { return r.headBits.has(b) }

func (r *Replica) checkIO(off, length int64) error {
	if r.closed {
		return ErrClosed
	}
	return blockdev.CheckRange(off, length, r.size)
}

// ReadAt reads from the chain: each block from the one layer the location
// map names, runs of blocks from the same layer in one pread.
func (r *Replica) ReadAt(p []byte, off int64) (int, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if err := r.checkIO(off, int64(len(p))); err != nil {
		return 0, err
	}
	if err := r.readLocked(p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (r *Replica) readLocked(p []byte, off int64) error {
	end := off + int64(len(p))
	for blk, last := off/bs, (end-1)/bs; blk <= last && len(p) > 0; {
		var l *layer
		var runStop int64
		if r.headHas(blk) {
			l = r.head
			runStop = r.headBits.runEnd(blk, last+1, true)
		} else {
			clearStop := r.headBits.runEnd(blk, last+1, false)
			slot := r.owner.get(blk)
			runStop = r.owner.runEnd(blk+1, clearStop, slot)
			l = r.slots[slot] // nil for slot 0
		}
		lo, hi := max(off, blk*bs), min(end, runStop*bs)
		seg := p[lo-off : hi-off]
		if l == nil {
			clear(seg)
		} else if err := readFull(l.f, seg, lo); err != nil {
			return fmt.Errorf("read %s at %d: %w", l.file, lo, err)
		}
		blk = runStop
	}
	return nil
}

// lowerRead reads block blk as the layers under the head hold it.
func (r *Replica) lowerRead(p []byte, blk int64) error {
	l := r.slots[r.owner.get(blk)]
	if l == nil {
		clear(p)
		return nil
	}
	if err := readFull(l.f, p, blk*bs); err != nil {
		return fmt.Errorf("read %s at %d: %w", l.file, blk*bs, err)
	}
	return nil
}

// needsRMW reports whether block blk, written only in part by [off, end),
// must first be copied up from a lower layer.
func (r *Replica) needsRMW(blk, off, end int64) bool {
	covered := off <= blk*bs && end >= (blk+1)*bs
	return !covered && !r.headHas(blk)
}

// WriteAt writes into the head. A block the head does not hold yet and the
// write covers only in part is first filled from the layer below, since a
// block is always read from exactly one layer.
func (r *Replica) WriteAt(p []byte, off int64) (int, error) {
	length := int64(len(p))
	r.mu.RLock()
	if err := r.checkIO(off, length); err != nil || length == 0 {
		r.mu.RUnlock()
		return 0, err
	}
	first, last := off/bs, (off+length-1)/bs
	if !r.needsRMW(first, off, off+length) && !r.needsRMW(last, off, off+length) && !r.importMarked(first, last+1) {
		// Common case: no lower data involved, so writers can share the lock;
		// the head bit is set only once the data is in the file.
		_, err := r.head.f.WriteAt(p, off)
		if err == nil {
			r.headBits.set(first, last+1)
			r.discarded.clear(first, last+1)
		}
		r.mu.RUnlock()
		if err != nil {
			return 0, fmt.Errorf("write %s at %d: %w", r.head.file, off, err)
		}
		return len(p), nil
	}
	r.mu.RUnlock()

	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.checkIO(off, length); err != nil {
		return 0, err
	}
	if err := r.writeLocked(p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeLocked writes p at off with read-modify-write of partial blocks the
// head lacks. Each such block is written whole in one pwrite, so a crash
// cannot leave the head holding a block with only part of its content.
func (r *Replica) writeLocked(p []byte, off int64) error {
	end := off + int64(len(p))
	first, last := off/bs, (end-1)/bs
	lo, hi := off, end // the part written straight from p
	if r.imp != nil {
		r.noteImportWrite(off, end)
	}
	edge := func(blk int64, buf []byte) error {
		if err := r.lowerRead(buf, blk); err != nil {
			return err
		}
		bstart := blk * bs
		s, e := max(off, bstart), min(end, bstart+bs)
		copy(buf[s-bstart:e-bstart], p[s-off:e-off])
		if _, err := r.head.f.WriteAt(buf, bstart); err != nil {
			return fmt.Errorf("write %s at %d: %w", r.head.file, bstart, err)
		}
		return nil
	}
	if r.needsRMW(first, off, end) {
		if err := edge(first, r.scratch[:bs]); err != nil {
			return err
		}
		lo = min((first+1)*bs, end)
	}
	if last != first && r.needsRMW(last, off, end) {
		if err := edge(last, r.scratch[bs:]); err != nil {
			return err
		}
		hi = last * bs
	}
	if lo < hi {
		if _, err := r.head.f.WriteAt(p[lo-off:hi-off], lo); err != nil {
			return fmt.Errorf("write %s at %d: %w", r.head.file, lo, err)
		}
	}
	r.headBits.set(first, last+1)
	r.discarded.clear(first, last+1)
	return nil
}

// punchHead makes the head hold none of blocks [b, e): their data is
// punched and their zero marks cleared. The caller knows nothing shows
// through from below that must not.
func (r *Replica) punchHead(b, e int64) error {
	err := unix.Fallocate(int(r.head.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, b*bs, (e-b)*bs)
	if err != nil {
		return fmt.Errorf("punch %s at %d length %d: %w", r.head.file, b*bs, (e-b)*bs, err)
	}
	r.headBits.clear(b, e)
	return r.unmarkHead(b, e)
}

// Unmap frees whole head blocks no lower layer holds: freeing a block a
// lower layer holds would reveal older data, which even the TRIM contract
// does not allow. Blocks a lower layer holds are marked discarded instead,
// so that a purge can free them once that layer is a removed snapshot
// under the head (discard.go).
func (r *Replica) Unmap(off, length int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.checkIO(off, length); err != nil {
		return err
	}
	stop := (off + length) / bs
	if r.imp != nil {
		r.noteImportUnmap((off+bs-1)/bs, stop)
		return nil
	}
	for b := (off + bs - 1) / bs; b < stop; {
		lower := r.owner.get(b) != 0
		e := r.owner.lowerRunEnd(b, stop, lower)
		if lower {
			r.discarded.set(b, e)
			r.persistDiscarded(b, e)
		} else if err := r.punchHeld(b, e); err != nil {
			return err
		}
		b = e
	}
	return nil
}

// WriteZeroes makes the range read as zeros: head blocks with nothing below
// are punched, blocks a lower layer holds get zero marks in the head and
// no data (zeromarks.go), and partial blocks at the ends are written like
// any write. Whole blocks never allocate data.
func (r *Replica) WriteZeroes(off, length int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.checkIO(off, length); err != nil {
		return err
	}
	if n := min(length, (bs-off%bs)%bs); n > 0 {
		if err := r.writeLocked(zeroBuf[:n], off); err != nil {
			return err
		}
		off, length = off+n, length-n
	}
	if n := (off + length) % bs; length > 0 && n > 0 {
		if err := r.writeLocked(zeroBuf[:n], off+length-n); err != nil {
			return err
		}
		length -= n
	}
	stop := (off + length) / bs
	if r.imp != nil {
		return r.importZeroes(off/bs, stop)
	}
	for b := off / bs; b < stop; {
		lower := r.owner.get(b) != 0
		e := r.owner.lowerRunEnd(b, stop, lower)
		if !lower {
			if err := r.punchHead(b, e); err != nil {
				return err
			}
		} else if err := r.markHeadZeros(b, e); err != nil {
			return err
		} else {
			r.discarded.set(b, e) // a mark only hides lower data
			r.persistDiscarded(b, e)
		}
		b = e
	}
	return nil
}
