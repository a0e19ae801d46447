package replica

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Revert discards the head and starts a new empty head on top of snapshot
// name. Snapshots taken after name stay, as a branch of its children.
// Crash safety: the new head is made durable, then replacing volume.meta
// commits; before that Open deletes the new head, after it the old one.
func (r *Replica) Revert(name string) error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if err := r.checkNotImporting(); err != nil {
		return fmt.Errorf("revert to %q: %w", name, err)
	}
	s := r.snaps[name]
	if s == nil {
		return fmt.Errorf("revert: %w: %q", ErrSnapshotNotFound, name)
	}
	if s.meta.Removed {
		return fmt.Errorf("revert: %w: %q", ErrSnapshotRemoved, name)
	}
	if err := r.replaceHead(name, "revert"); err != nil {
		return fmt.Errorf("revert to %q: %w", name, err)
	}
	return nil
}

// replaceHead discards the head and puts a new empty one on parent ("":
// the root of the chain, over the backing file if any); what names the
// crash points. The caller holds opMu.
func (r *Replica) replaceHead(parent, what string) error {
	if r.vol.HeadIndex >= maxHeadIndex {
		return fmt.Errorf("head index %d exhausted", r.vol.HeadIndex)
	}
	// Snapshots are immutable and opMu keeps purge away, so the new map can
	// be built before stopping I/O.
	chain, err := r.chainBelow(parent)
	if err != nil {
		return err
	}
	owner, err := buildOwnerMap(chain, r.size)
	if err != nil {
		return err
	}
	newHead, err := r.prepareHead(parent)
	if err != nil {
		return err
	}
	err = syncDir(r.dir)
	crashPoint(what + ":prepared")
	vol := r.volMeta()
	vol.Head, vol.HeadIndex = newHead.file, newHead.index
	renamed := false
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		renamed, err = commitVolumeMeta(r.dir, vol)
	}
	if !renamed {
		newHead.f.Close()
		r.removeFiles(newHead.file, newHead.file+metaSuffix)
		return err
	}
	old := r.head
	r.vol = vol
	r.freeSlot(old)
	old.f.Close()
	closeZeros(old)
	r.head = r.addLayer(&layer{kind: kindHead, file: newHead.file, f: newHead.f, meta: newHead.meta,
		zeros: newBitmap(r.size / bs)})
	r.owner = owner
	r.headBits = newBitmap(r.size / bs)
	r.discarded = newBitmap(r.size / bs)
	r.closeDiscardFile()
	if err != nil {
		return err
	}
	crashPoint(what + ":committed")
	r.removeFiles(old.file, old.file+metaSuffix, discardFileName(old.file), zeroFileName(old.file))
	return nil
}

// Expand grows the volume to newSize, a multiple of 4 KiB. Only the head
// file grows: lower layers have no data past their old size, and a backing
// file is never larger than the volume. The head grows first, so an
// uncommitted expand leaves only a longer head, which is harmless.
func (r *Replica) Expand(newSize int64) error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if err := r.checkNotImporting(); err != nil {
		return fmt.Errorf("expand: %w", err)
	}
	if newSize%bs != 0 || newSize/bs > maxBlocks {
		return fmt.Errorf("expand to %d: not a multiple of %d up to %d", newSize, bs, int64(maxBlocks)*bs)
	}
	if newSize < r.size {
		return fmt.Errorf("expand to %d: smaller than the current size %d; volumes only grow", newSize, r.size)
	}
	if newSize == r.size {
		return nil
	}
	if err := r.head.f.Truncate(newSize); err != nil {
		return fmt.Errorf("expand: grow %s: %w", filepath.Join(r.dir, r.head.file), err)
	}
	if err := unix.Fsync(int(r.head.f.Fd())); err != nil {
		return fmt.Errorf("expand: sync %s: %w", filepath.Join(r.dir, r.head.file), err)
	}
	// owner changes only under opMu, so it can be extended before stopping
	// I/O; head bits change with every write, so they are extended under
	// it. Either shares its pages: only the page tables grow (blockmap.go).
	owner := r.owner.grown(newSize / bs)
	vol := r.volMeta()
	vol.Size = newSize
	r.mu.Lock()
	defer r.mu.Unlock()
	renamed, err := commitVolumeMeta(r.dir, vol)
	if !renamed {
		return fmt.Errorf("expand to %d: %w", newSize, err)
	}
	r.vol, r.size, r.owner, r.headBits = vol, newSize, owner, r.headBits.grown(newSize/bs)
	r.discarded = r.discarded.grown(newSize / bs)
	r.growZeros(newSize / bs)
	if err != nil {
		return fmt.Errorf("expand to %d: %w", newSize, err)
	}
	return nil
}
