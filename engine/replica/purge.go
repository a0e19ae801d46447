package replica

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

type purgeStep int

const (
	stepNone purgeStep = iota
	stepDelete
	stepCoalesce
	stepPrune
)

// Purge frees the data of snapshots marked removed, repeating until nothing
// changes. For a removed snapshot R:
//   - no child (a leaf left by a revert): R is deleted;
//   - one child, a snapshot C: R and C become one layer named C (C's data
//     wins), R is deleted;
//   - one child, the head: R's blocks the head overwrote are punched out;
//   - several children: R is left alone.
//
// opMu is held throughout, so other structural changes wait; the I/O lock is
// taken only to swap layers. Copies run outside it because both snapshot
// layers are immutable and every block written during a copy is one that
// reads still take from another layer holding the same data. progress, if
// not nil, gets 0..100 in increasing order.
func (r *Replica) Purge(ctx context.Context, progress func(pct int)) error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if r.closed {
		return ErrClosed
	}
	// A reused replica's own snapshots wait, unchanged, for the import's
	// commit to keep or drop them.
	if err := r.checkNotImporting(); err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	last := -1
	report := func(pct int) {
		if progress != nil && pct > last {
			last = pct
			progress(pct)
		}
	}
	report(0)
	total := 0
	for _, s := range r.snaps {
		if s.meta.Removed {
			total++
		}
	}
	done := 0
	pruned := map[*layer]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		step, rem, child := r.nextPurgeStep(pruned)
		if step == stepNone {
			break
		}
		frac := func(f float64) { report(min(99, int((float64(done)+f)*100/float64(total)))) }
		var err error
		switch step {
		case stepDelete:
			err = r.deleteLeaf(rem)
		case stepPrune:
			pruned[rem] = true
			err = r.prune(ctx, rem, frac)
		case stepCoalesce:
			err = r.coalesce(ctx, rem, child, frac)
		}
		if err != nil {
			return fmt.Errorf("purge: %w", err)
		}
		done++
		frac(0)
	}
	report(100)
	return nil
}

// nextPurgeStep picks the oldest removed snapshot something can be done to.
func (r *Replica) nextPurgeStep(pruned map[*layer]bool) (purgeStep, *layer, *layer) {
	for _, s := range r.sortedSnapshots() {
		if !s.meta.Removed || pruned[s] {
			continue
		}
		snaps, head := r.children(s.meta.Name)
		switch {
		case len(snaps) == 0 && !head:
			return stepDelete, s, nil
		case len(snaps) == 1 && !head:
			return stepCoalesce, s, snaps[0]
		case len(snaps) == 0 && head:
			return stepPrune, s, nil
		}
	}
	return stepNone, nil, nil
}

// volMeta is volume.meta as memory has it. The snapshot list is always
// taken from memory, so a commit that failed is repaired by the next one.
func (r *Replica) volMeta() volumeMeta {
	v := r.vol
	v.Snapshots = make([]string, 0, len(r.snaps))
	for n := range r.snaps {
		v.Snapshots = append(v.Snapshots, n)
	}
	slices.Sort(v.Snapshots)
	return v
}

// dropSnapshot forgets s in memory, then commits volume.meta without it and
// deletes its files. If the commit fails s stays listed on disk as a
// removed leaf (its files are kept), which the next purge deletes.
func (r *Replica) dropSnapshot(s *layer, closeFile bool) error {
	r.mu.Lock()
	delete(r.snaps, s.meta.Name)
	r.freeSlot(s)
	if closeFile {
		s.f.Close()
	}
	closeZeros(s)
	vol := r.volMeta()
	r.mu.Unlock()
	renamed, err := commitVolumeMeta(r.dir, vol)
	if renamed {
		r.mu.Lock()
		r.vol = vol
		r.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("delete snapshot %q: %w", s.meta.Name, err)
	}
	crashPoint("drop:committed")
	r.removeFiles(s.file, s.file+metaSuffix, zeroFileName(s.file))
	return nil
}

// deleteLeaf deletes a removed snapshot without children. It is not under
// the head, so the location map does not refer to it.
func (r *Replica) deleteLeaf(s *layer) error { return r.dropSnapshot(s, true) }

// prune punches out the blocks of s (the head's parent) that the head
// holds, and those the head discarded that nothing below s holds
// (discard.go), and clears s's zero marks that no longer hide anything
// (zeromarks.go); a snapshot left empty is dropped. The head never drops a
// block a lower layer holds until settlePrune, and writes only add head
// blocks, so reads of the punched blocks go to the head or are of blocks
// the user trimmed: no lock is needed for the punches. Blocks the head
// holds keep naming s in the location map unless nothing below s holds
// them; that only makes Unmap keep them, and the next snapshot overwrites
// the entries.
func (r *Replica) prune(ctx context.Context, s *layer, frac func(float64)) error {
	r.mu.RLock()
	size := r.size
	r.mu.RUnlock()
	plan, err := r.planPrune(s, size)
	if err != nil {
		return err
	}
	if len(plan.punch) > 0 || len(plan.unmark) > 0 {
		if err := r.punchPruned(ctx, s, plan, frac); err != nil {
			return err
		}
	}
	if err := r.settlePrune(plan); err != nil {
		return err
	}
	empty, err := isEmpty(s, size)
	if err != nil || !empty {
		return err
	}
	return r.dropEmptyUnderHead(s, size)
}

// punchPruned punches the plan's blocks out of s and clears its marks,
// durably, giving s a new ID.
func (r *Replica) punchPruned(ctx context.Context, s *layer, plan prunePlan, frac func(float64)) error {
	punch := plan.punch
	// s's blocks change: its ID goes first and comes back as another once
	// the punches are durable (see layerid.go for why a prune needs one).
	id := s.meta.ID
	if err := r.forgetLayerID(s); err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	// The head's copies (data and marks) must be durable before the
	// snapshot's go.
	if err := unix.Fdatasync(int(r.head.f.Fd())); err != nil {
		return fmt.Errorf("prune: sync %s: %w", r.head.file, err)
	}
	r.mu.RLock()
	err := r.syncZeros(r.head)
	r.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	crashPoint("prune:synced")
	for i, e := range punch {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := unix.Fallocate(int(s.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, e.Offset, e.Length)
		if err != nil {
			return fmt.Errorf("prune: punch %s at %d length %d: %w", s.file, e.Offset, e.Length, err)
		}
		frac(float64(i+1) / float64(len(punch)))
		if i == len(punch)/2 {
			crashPoint("prune:half")
		}
	}
	// Durable before settlePrune drops the head's marks over them.
	if err := unix.Fsync(int(s.f.Fd())); err != nil {
		return fmt.Errorf("prune: sync %s: %w", s.file, err)
	}
	if len(plan.unmark) > 0 {
		r.mu.Lock()
		for _, e := range plan.unmark {
			s.zeros.clear(e.Offset/bs, e.End()/bs)
		}
		r.mu.Unlock()
		err := r.persistZeroExtents(s, plan.unmark)
		if err == nil {
			err = r.syncZeros(s)
		}
		if err != nil {
			return fmt.Errorf("prune: %w", err)
		}
	}
	crashPoint("prune:punched")
	if id == "" {
		return nil
	}
	m := s.meta
	m.ID = prunedID(id, unionExtents(punch, plan.unmark))
	if err := r.setLayerMeta(s, m); err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	return nil
}

// coalesce merges removed snapshot rem into its only child c; the result
// keeps c's name and meta, with rem's parent. Whichever layer has less data
// is copied into the other:
//
//   - rem smaller: rem's blocks go into c's holes where c has no zero
//     mark either. Then c's .meta takes rem's parent, making rem a
//     childless leaf; then volume.meta drops it.
//   - c smaller: c's blocks overwrite rem's, in place, and rem's blocks
//     under c's zero marks are punched: reads take those blocks from c or
//     above, and rem, being removed, cannot be reverted to (Extents and
//     ReadLayer of rem may see the change). Then rem's file is linked over
//     c's image name (a temp link, renamed), so both names hold the merged
//     data; then c's .meta takes rem's parent; then volume.meta drops rem.
//
// Either way rem's zero marks where c holds nothing join c's marks (in
// c's marks file, before c's .meta changes): they read as zeros from c as
// they did from rem, so adding them changes nothing anyone reads.
//
// At every step the chain on disk reads the same data, so a crash anywhere
// leaves a volume that opens and reads the same; purge finishes the job.
func (r *Replica) coalesce(ctx context.Context, rem, c *layer, frac func(float64)) error {
	r.mu.RLock()
	size := r.size
	r.mu.RUnlock()
	remExts, err := dataExtents(rem.f, size)
	if err != nil {
		return fmt.Errorf("coalesce %s: %w", rem.file, err)
	}
	cExts, err := dataExtents(c.f, size)
	if err != nil {
		return fmt.Errorf("coalesce %s: %w", c.file, err)
	}
	cMarks := subtractExtents(markExtents(c, size), cExts)
	cHeld := unionExtents(cExts, cMarks)
	addMarks := subtractExtents(subtractExtents(markExtents(rem, size), remExts), cHeld)
	intoChild := extentBytes(remExts) <= extentBytes(cExts)
	// Both layers may change in place; neither may keep an ID that claims
	// its old content meanwhile. c gets the merged ID with its new parent.
	remID, cID := rem.meta.ID, c.meta.ID
	if err := r.forgetLayerID(rem, c); err != nil {
		return fmt.Errorf("coalesce: %w", err)
	}
	if intoChild {
		err = copyExtents(ctx, rem, c, subtractExtents(remExts, cHeld), frac)
	} else if err = copyExtents(ctx, c, rem, cExts, frac); err == nil {
		err = punchExtents(rem, intersectExtents(remExts, cMarks))
	}
	if err != nil {
		return err
	}
	merged := c
	if !intoChild {
		merged = rem
	}
	if err := unix.Fdatasync(int(merged.f.Fd())); err != nil {
		return fmt.Errorf("coalesce: sync %s: %w", merged.file, err)
	}
	if err := r.addZeroMarks(c, addMarks); err != nil {
		return fmt.Errorf("coalesce: %w", err)
	}
	crashPoint("coalesce:copied")
	if !intoChild {
		tmp := tmpName(c.file + ".purge")
		r.removeFiles(tmp)
		err := os.Link(filepath.Join(r.dir, rem.file), filepath.Join(r.dir, tmp))
		crashPoint("coalesce:linked")
		if err == nil {
			err = os.Rename(filepath.Join(r.dir, tmp), filepath.Join(r.dir, c.file))
		}
		if err == nil {
			err = syncDir(r.dir)
		}
		if err != nil {
			r.removeFiles(tmp)
			return fmt.Errorf("coalesce: replace %s with %s: %w", c.file, rem.file, err)
		}
		crashPoint("coalesce:renamed")
	}
	m := c.meta
	m.Parent = rem.meta.Parent
	m.ID = coalescedID(remID, cID)
	err = writeLayerMeta(r.dir, c.file, m)
	if err == nil {
		err = syncDir(r.dir)
	}
	if err != nil {
		// Memory is left as it was: its descriptors still read the same
		// data, and whatever reached the disk opens consistently.
		return fmt.Errorf("coalesce %s into %s: %w", rem.file, c.file, err)
	}
	crashPoint("coalesce:meta")

	r.mu.Lock()
	var oldF *os.File
	if !intoChild {
		oldF, c.f = c.f, rem.f
	}
	c.meta = m
	r.owner.replace(rem.slot, c.slot)
	r.mu.Unlock()
	if oldF != nil {
		oldF.Close()
	}
	crashPoint("coalesce:swapped")
	return r.dropSnapshot(rem, intoChild)
}

// copyPiece is copyExtents' unit; copyBehind is how many written pieces
// may still be cached before the oldest is waited for and dropped.
const (
	copyPiece  = 1 << 20
	copyBehind = 8
)

// copyExtents copies exts from src to dst in copyPiece pieces.
//
// It keeps to a few pieces of page cache: a piece's source pages are
// dropped once read (src is garbage after the merge), its writeback starts
// once it is written, and copyBehind pieces later that writeback is waited
// for and its pages dropped; the next pieces reuse the pages freed. A copy
// that kept everything cached would take as many new pages as it copies,
// and in a VM that hands freed memory back to the host (free page
// reporting) each costs a fault: purge ran at a quarter of cp's speed.
// Durability is unchanged: the caller's fdatasync still commits the data;
// this only writes it back sooner. The merged blocks are not left cached.
func copyExtents(ctx context.Context, src, dst *layer, exts []Extent, frac func(float64)) error {
	total := extentBytes(exts)
	if total == 0 {
		return nil
	}
	buf := make([]byte, min(total, copyPiece))
	srcFd, dstFd := int(src.f.Fd()), int(dst.f.Fd())
	var cached []Extent // pieces of dst written and maybe still in the page cache
	var done int64
	for _, e := range exts {
		for pos := e.Offset; pos < e.End(); {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(e.End()-pos, int64(len(buf)))
			if err := readFull(src.f, buf[:n], pos); err != nil {
				return fmt.Errorf("coalesce: read %s at %d: %w", src.file, pos, err)
			}
			if _, err := dst.f.WriteAt(buf[:n], pos); err != nil {
				return fmt.Errorf("coalesce: write %s at %d: %w", dst.file, pos, err)
			}
			_ = unix.Fadvise(srcFd, pos, n, unix.FADV_DONTNEED) // advice: an error costs only memory
			if err := unix.SyncFileRange(dstFd, pos, n, unix.SYNC_FILE_RANGE_WRITE); err != nil {
				return fmt.Errorf("coalesce: write back %s at %d: %w", dst.file, pos, err)
			}
			cached = append(cached, Extent{Offset: pos, Length: n})
			if len(cached) > copyBehind {
				old := cached[0]
				cached = cached[1:]
				err := unix.SyncFileRange(dstFd, old.Offset, old.Length,
					unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
				if err != nil {
					return fmt.Errorf("coalesce: write back %s at %d: %w", dst.file, old.Offset, err)
				}
				_ = unix.Fadvise(dstFd, old.Offset, old.Length, unix.FADV_DONTNEED)
			}
			pos += n
			done += n
			frac(float64(done) / float64(total))
		}
	}
	return nil
}
