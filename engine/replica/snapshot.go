package replica

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/types"
)

// SnapshotOptions describes a new snapshot.
type SnapshotOptions struct {
	// UserCreated marks snapshots a user asked for; only those count
	// against SetLimits. System snapshots (for example for a rebuild) are
	// never refused for limits.
	UserCreated bool
	// Created defaults to now.
	Created time.Time
	Labels  map[string]string
	// ID names the snapshot's content (see layerid.go): an engine sends
	// the same random ID to every replica. Empty: the replica makes one up,
	// so the layer matches no other replica's.
	ID string
}

// LayerInfo describes one layer of the replica.
type LayerInfo struct {
	Name        string // HeadName for the head
	Parent      string // "" at the bottom of the chain
	Children    []string
	Removed     bool
	UserCreated bool
	Created     time.Time
	// Size: allocated bytes (st_blocks * 512) of the layer's image and of
	// its zero-marks file, if any (metadata: 4 KiB per 128 MiB of volume
	// where marks are), so the sizes add up to what du says.
	Size   int64
	Labels map[string]string
	ID     string // snapshots: the content's ID, "" if unknown (see layerid.go)
	// Exclusive: snapshots, the allocated bytes deleting the snapshot
	// would free now (for a removed one, what the next purge frees).
	Exclusive int64
}

// Info describes the whole replica.
type Info struct {
	Size        int64 // volume size in bytes
	BackingFile string
	// BackingSize is the backing file's length in bytes (0 without one).
	BackingSize int64
	// Layers holds every snapshot, oldest first, then the head.
	Layers []LayerInfo
}

func allocated(l *layer) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(l.f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", l.file, err)
	}
	return st.Blocks * 512, nil
}

// children lists the snapshots whose parent is name, oldest first, and
// whether the head's parent is name.
func (r *Replica) children(name string) (snaps []*layer, head bool) {
	for _, s := range r.snaps {
		if s.meta.Parent == name {
			snaps = append(snaps, s)
		}
	}
	sortLayers(snaps)
	return snaps, r.head.meta.Parent == name
}

func sortLayers(ls []*layer) {
	slices.SortFunc(ls, func(a, b *layer) int {
		if c := a.meta.createdTime().Compare(b.meta.createdTime()); c != 0 {
			return c
		}
		if a.meta.Name < b.meta.Name {
			return -1
		}
		if a.meta.Name > b.meta.Name {
			return 1
		}
		return 0
	})
}

func (r *Replica) sortedSnapshots() []*layer {
	ls := slices.Collect(maps.Values(r.snaps))
	sortLayers(ls)
	return ls
}

// Chain describes every layer: the tree of snapshots and the head.
func (r *Replica) Chain() (Info, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return Info{}, ErrClosed
	}
	info := Info{Size: r.size, BackingFile: r.vol.BackingFile}
	if r.backing != nil {
		st, err := r.backing.f.Stat()
		if err != nil {
			return Info{}, fmt.Errorf("stat backing file: %w", err)
		}
		info.BackingSize = st.Size()
	}
	describe := func(l *layer) (LayerInfo, error) {
		size, err := r.layerAllocated(l)
		if err != nil {
			return LayerInfo{}, err
		}
		li := LayerInfo{
			Name: l.name(), Parent: l.meta.Parent, Removed: l.meta.Removed, UserCreated: l.meta.UserCreated,
			Created: l.meta.createdTime(), Size: size, Labels: maps.Clone(l.meta.Labels), ID: l.meta.ID,
		}
		if l.kind == kindSnapshot {
			if li.Exclusive, err = r.exclusiveBytes(l); err != nil {
				return LayerInfo{}, err
			}
			snaps, head := r.children(l.meta.Name)
			for _, c := range snaps {
				li.Children = append(li.Children, c.meta.Name)
			}
			if head {
				li.Children = append(li.Children, HeadName)
			}
		}
		return li, nil
	}
	for _, l := range append(r.sortedSnapshots(), r.head) {
		li, err := describe(l)
		if err != nil {
			return Info{}, err
		}
		info.Layers = append(info.Layers, li)
	}
	r.exts.forget(func(l *layer) bool { return l == r.backing || r.snaps[l.meta.Name] == l })
	return info, nil
}

// checkLimits refuses a user snapshot beyond SetLimits. Removed snapshots
// still hold data until purged, so they count for size but not for count.
func (r *Replica) checkLimits() error {
	r.mu.RLock()
	maxCount, maxSize := r.maxCount, r.maxSize
	r.mu.RUnlock()
	if maxCount > 0 {
		n := 0
		for _, s := range r.snaps {
			if s.meta.UserCreated && !s.meta.Removed {
				n++
			}
		}
		if n >= maxCount {
			return fmt.Errorf("%w: %d user snapshots, at most %d allowed", ErrSnapshotLimitExceeded, n, maxCount)
		}
	}
	if maxSize > 0 {
		var total int64
		for _, s := range r.snaps {
			n, err := r.layerAllocated(s)
			if err != nil {
				return err
			}
			total += n
		}
		if total >= maxSize {
			return fmt.Errorf("%w: snapshots take %d bytes, at most %d allowed", ErrSnapshotLimitExceeded, total, maxSize)
		}
	}
	return nil
}

// CheckSnapshot reports, without changing anything, the error Snapshot
// would return now for a reason other than I/O: name, duplicate, limits.
// It lets an engine check every replica before snapshotting any; Snapshot
// checks again, since things may change in between.
func (r *Replica) CheckSnapshot(name string, opts SnapshotOptions) error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	return r.snapshotAllowed(name, opts)
}

func (r *Replica) snapshotAllowed(name string, opts SnapshotOptions) error {
	if err := types.ValidateSnapshotName(name); err != nil {
		return err
	}
	if r.closed {
		return ErrClosed
	}
	if err := r.checkNotImporting(); err != nil {
		return fmt.Errorf("snapshot %q: %w", name, err)
	}
	if r.snaps[name] != nil {
		return fmt.Errorf("%w: %q", ErrSnapshotExists, name)
	}
	if opts.UserCreated {
		if err := r.checkLimits(); err != nil {
			return err
		}
	}
	if len(r.snaps) >= maxSnapshots {
		return fmt.Errorf("%w: snapshot %q: already %d snapshots", ErrTooManyLayers, name, len(r.snaps))
	}
	if r.vol.HeadIndex >= maxHeadIndex {
		return fmt.Errorf("snapshot %q: head index %d exhausted", name, r.vol.HeadIndex)
	}
	for k := range opts.Labels {
		if k == "" {
			return fmt.Errorf("snapshot %q: labels: empty key", name)
		}
	}
	if opts.ID != "" {
		if err := validateLayerID(opts.ID); err != nil {
			return fmt.Errorf("snapshot %q: %w", name, err)
		}
	}
	return nil
}

// Snapshot freezes the head as snapshot name and starts a new empty head on
// top. No data is copied: the head file is hard-linked under the snapshot's
// name. Crash safety: the snapshot's .meta, the link and the new head are
// made durable first; replacing volume.meta commits; the old head's names
// are removed last. Open deletes whichever side's names are not referenced.
func (r *Replica) Snapshot(name string, opts SnapshotOptions) error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if err := r.snapshotAllowed(name, opts); err != nil {
		return err
	}
	created := opts.Created
	if created.IsZero() {
		created = time.Now()
	}
	id := opts.ID
	if id == "" {
		id = NewLayerID()
	}
	snapImg := snapFileName(name)
	snapMeta := layerMeta{
		Name: name, Parent: r.head.meta.Parent, UserCreated: opts.UserCreated,
		Created: formatTime(created), Labels: maps.Clone(opts.Labels), ID: id,
	}
	if err := snapMeta.validate(); err != nil {
		return fmt.Errorf("snapshot %q: %w", name, err)
	}
	newHead, err := r.prepareHead(name)
	if err != nil {
		return fmt.Errorf("snapshot %q: %w", name, err)
	}
	oldHead := r.head
	committed := false
	defer func() {
		if !committed {
			newHead.f.Close()
			r.removeFiles(newHead.file, newHead.file+metaSuffix, snapImg, snapImg+metaSuffix, zeroFileName(snapImg))
		}
	}()
	r.removeFiles(snapImg, snapImg+metaSuffix, zeroFileName(snapImg)) // unreferenced, so leftovers
	if err := writeLayerMeta(r.dir, snapImg, snapMeta); err != nil {
		return fmt.Errorf("snapshot %q: %w", name, err)
	}
	crashPoint("snapshot:prepared")
	// Sync the bulk of the head's dirty data before stopping I/O.
	if err := unix.Fdatasync(int(oldHead.f.Fd())); err != nil {
		return fmt.Errorf("snapshot %q: sync %s: %w", name, oldHead.file, err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	err = unix.Fdatasync(int(oldHead.f.Fd()))
	if err == nil {
		err = r.syncZeros(oldHead)
	}
	if err == nil {
		err = os.Link(filepath.Join(r.dir, oldHead.file), filepath.Join(r.dir, snapImg))
	}
	if err == nil && oldHead.zeroF != nil {
		// The marks go with the layer, linked like its image.
		err = os.Link(filepath.Join(r.dir, zeroFileName(oldHead.file)), filepath.Join(r.dir, zeroFileName(snapImg)))
	}
	if err == nil {
		err = syncDir(r.dir)
	}
	crashPoint("snapshot:linked")
	vol := r.volMeta()
	vol.Head, vol.HeadIndex = newHead.file, newHead.index
	vol.Snapshots = append(vol.Snapshots, name)
	if err == nil {
		committed, err = commitVolumeMeta(r.dir, vol)
	}
	if !committed {
		return fmt.Errorf("snapshot %q: %w", name, err)
	}
	if err != nil {
		// volume.meta was replaced but maybe not durably: follow it, so
		// that writes go where a successful Open would look, and report.
		err = fmt.Errorf("snapshot %q: %w", name, err)
	}
	r.vol = vol
	oldFile := oldHead.file
	oldHead.kind, oldHead.file, oldHead.meta = kindSnapshot, snapImg, snapMeta
	r.snaps[name] = oldHead
	if emptyBitmap(oldHead.zeros) {
		oldHead.zeros = nil
	}
	r.head = r.addLayer(&layer{kind: kindHead, file: newHead.file, f: newHead.f, meta: newHead.meta,
		zeros: newBitmap(r.size / bs)})
	// The old head's blocks (data and marks) now belong to the snapshot.
	for b, n := int64(0), r.size/bs; b < n; {
		if b = r.headBits.runEnd(b, n, false); b < n {
			e := r.headBits.runEnd(b, n, true)
			r.owner.fill(b, e, oldHead.slot)
			b = e
		}
	}
	r.headBits.clearAll()
	// The snapshot keeps the old head's trims unapplied: reads of those
	// blocks may return the older data again, as TRIM allows.
	r.discarded.clearAll()
	r.closeDiscardFile()
	if err == nil {
		crashPoint("snapshot:committed")
		r.removeFiles(oldFile, oldFile+metaSuffix, discardFileName(oldFile), zeroFileName(oldFile))
	}
	return err
}

type preparedHead struct {
	file  string
	index int
	f     *os.File
	meta  layerMeta
}

// prepareHead creates the next head file, empty and of the volume size,
// with its .meta naming parent; durable once the directory is synced.
func (r *Replica) prepareHead(parent string) (preparedHead, error) {
	h := preparedHead{index: r.vol.HeadIndex + 1}
	h.file = headFileName(h.index)
	h.meta = layerMeta{Name: HeadName, Parent: parent, Created: formatTime(time.Now())}
	path := filepath.Join(r.dir, h.file)
	r.removeFiles(h.file, h.file+metaSuffix, zeroFileName(h.file)) // unreferenced, so leftovers
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return h, err
	}
	err = f.Truncate(r.size)
	if err == nil {
		err = writeLayerMeta(r.dir, h.file, h.meta)
	}
	if err != nil {
		f.Close()
		r.removeFiles(h.file, h.file+metaSuffix)
		return h, err
	}
	h.f = f
	return h, nil
}

// removeFiles deletes files in the directory, best effort: what is left
// behind is unreferenced and Open deletes it.
func (r *Replica) removeFiles(names ...string) {
	for _, n := range names {
		_ = os.Remove(filepath.Join(r.dir, n))
	}
}

// RemoveSnapshot marks a snapshot removed; Purge frees its data later.
func (r *Replica) RemoveSnapshot(name string) error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if r.closed {
		return ErrClosed
	}
	s := r.snaps[name]
	if s == nil {
		return fmt.Errorf("%w: %q", ErrSnapshotNotFound, name)
	}
	if s.meta.Removed {
		return nil
	}
	m := s.meta
	m.Removed = true
	if err := writeLayerMeta(r.dir, s.file, m); err != nil {
		return fmt.Errorf("remove snapshot %q: %w", name, err)
	}
	if err := syncDir(r.dir); err != nil {
		return fmt.Errorf("remove snapshot %q: %w", name, err)
	}
	r.mu.Lock()
	s.meta = m
	r.mu.Unlock()
	return nil
}
