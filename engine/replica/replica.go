// Package replica stores one replica of a volume as a directory of sparse
// layer files: a writable head on top of a chain of immutable snapshots,
// optionally over a read-only backing file. It implements blockdev.Device.
//
// On-disk format (one directory per replica):
//
//	volume.meta                    JSON root: formatVersion, size, head file
//	                               name + index, backingFile, snapshot list
//	volume-head-NNN.img(.meta)     the writable head layer
//	volume-snap-<name>.img(.meta)  immutable snapshot layers
//	<layer image>.zero             a layer's zero marks (zeromarks.go)
//	volume-head-NNN.img.discard    the head's discard hints (discard.go)
//
// Every layer image is a sparse file; a block (4 KiB) a layer holds is
// allocated in its file or marked in its zero marks (a block it holds as
// zeros, at no data cost), a block it does not hold is a hole. A layer's .meta
// names its parent snapshot, so the chain is the parent links from the head
// down. volume.meta is replaced atomically (temp file, fsync, rename, fsync
// of the directory) as the commit point of every structural change; layer
// files it does not reference are leftovers of an interrupted change and
// Open deletes them.
package replica

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/internal/atomicfile"
	"github.com/strata-storage/strata/types"
)

const bs = blockdev.BlockSize

// Limits of the in-memory location map. Slots are uint16 and slot 0 means
// "no layer", so with the head and a backing file at most 65533 snapshots.
const (
	maxSnapshots = 1<<16 - 3
	maxBlocks    = 1 << 32 // 16 TiB
)

var (
	// ErrInvalidName: a snapshot name that cannot be used. It is the error
	// types.ValidateSnapshotName wraps, so the rule has one definition.
	ErrInvalidName = types.ErrInvalidSnapshotName
	// ErrSnapshotExists: a snapshot of that name is already in the chain.
	ErrSnapshotExists = errors.New("snapshot already exists")
	// ErrSnapshotNotFound: no snapshot of that name.
	ErrSnapshotNotFound = errors.New("snapshot not found")
	// ErrSnapshotRemoved: the snapshot is marked removed and waits for purge.
	ErrSnapshotRemoved = errors.New("snapshot is marked removed")
	// ErrSnapshotLimitExceeded: a user snapshot would exceed SetLimits.
	ErrSnapshotLimitExceeded = errors.New("snapshot limit exceeded")
	// ErrTooManyLayers: the location map cannot index another layer.
	ErrTooManyLayers = errors.New("too many layers")
	// ErrBadMeta: a metadata file is missing, unreadable or inconsistent.
	ErrBadMeta = errors.New("bad replica metadata")
	// ErrExists: Create found an existing replica.
	ErrExists = errors.New("replica already exists")
	// ErrClosed: the replica was closed.
	ErrClosed = errors.New("replica is closed")
)

type layerKind uint8

const (
	kindBacking layerKind = iota + 1
	kindSnapshot
	kindHead
)

// layer is one open layer file.
type layer struct {
	slot uint16
	kind layerKind
	file string // base name in the directory; absolute path for the backing file
	f    *os.File
	meta layerMeta // zero for the backing file
	// zeros: the blocks the layer holds as zeros while its file has a hole
	// there (zeromarks.go); nil for a layer with none. zeroF is the open
	// file they are kept in, nil if the layer has none.
	zeros *bitmap
	zeroF *os.File
}

func (l *layer) name() string {
	switch l.kind {
	case kindHead:
		return HeadName
	case kindSnapshot:
		return l.meta.Name
	}
	return ""
}

// Replica is one replica of a volume. It is safe for concurrent use.
//
// Locking: opMu serialises structural changes (snapshot, remove, purge,
// revert, expand, close) and is held for a whole purge. mu is the I/O lock:
// reads, Flush and writes that need no read-modify-write of a lower layer
// share it; everything that changes the location map other than setting a
// head bit takes it exclusively, and only briefly.
type Replica struct {
	dir  string
	opMu sync.Mutex
	mu   sync.RWMutex

	vol     volumeMeta
	size    int64
	slots   []*layer // by slot; slots[0] is nil
	free    []uint16
	snaps   map[string]*layer
	head    *layer
	backing *layer

	// The location map, per 4 KiB block: owner is the slot of the topmost
	// snapshot (or the backing file) of the head's chain holding the block,
	// 0 if none; headBits says the head holds it. That is 2 bytes + 1 bit
	// per block where the layers hold data (pages of 128 MiB of volume,
	// allocated on first use: blockmap.go). Keeping the head apart lets
	// Unmap and WriteZeroes see whether a lower layer holds a block, and
	// lets writes mark blocks with an atomic OR under the shared lock.
	owner    *ownerMap
	headBits *bitmap
	// discarded: blocks the head's user trimmed or zeroed while a lower
	// layer held them, not written since: a hint that lets a purge free
	// them from a removed snapshot under the head (discard.go), kept in
	// discardF too (discard_store.go).
	discarded *bitmap
	discardF  *os.File
	exts      extentCache // snapshot layers' data extents, for Chain

	maxCount int
	maxSize  int64
	closed   bool
	imp      *importState // a running import (rebuild), see import.go
	scratch  []byte       // two blocks for read-modify-write, under the exclusive lock
}

// CreateOptions configures a new replica.
type CreateOptions struct {
	// BackingFile is a read-only raw file at the bottom of the chain; it
	// must not be larger than the volume.
	BackingFile string
}

// Create makes a new replica in dir (created if needed) of size bytes, a
// positive multiple of 4 KiB.
func Create(dir string, size int64, opts CreateOptions) (*Replica, error) {
	if size <= 0 || size%bs != 0 || size/bs > maxBlocks {
		return nil, fmt.Errorf("create replica %s: size %d is not a positive multiple of %d up to %d",
			dir, size, bs, int64(maxBlocks)*bs)
	}
	// The parent is synced too: a crash must not lose the directory that
	// the instance manager's list of replicas already names.
	if err := atomicfile.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("create replica %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, volumeMetaFile)); err == nil {
		return nil, fmt.Errorf("create replica %s: %w", dir, ErrExists)
	}
	backing := ""
	if opts.BackingFile != "" {
		abs, err := filepath.Abs(opts.BackingFile)
		if err != nil {
			return nil, fmt.Errorf("create replica %s: backing file: %w", dir, err)
		}
		if err := checkBackingFile(abs, size); err != nil {
			return nil, fmt.Errorf("create replica %s: %w", dir, err)
		}
		backing = abs
	}
	head := headFileName(0)
	f, err := os.OpenFile(filepath.Join(dir, head), os.O_RDWR|os.O_CREATE|os.O_TRUNC, fileMode)
	if err != nil {
		return nil, fmt.Errorf("create replica %s: %w", dir, err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = writeLayerMeta(dir, head, layerMeta{Name: HeadName, Created: formatTime(time.Now())})
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err == nil {
		_, err = commitVolumeMeta(dir, volumeMeta{
			FormatVersion: formatVersion, Size: size, Head: head, BackingFile: backing, Snapshots: []string{},
		})
	}
	if err != nil {
		return nil, fmt.Errorf("create replica %s: %w", dir, err)
	}
	return Open(dir)
}

func checkBackingFile(path string, size int64) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("backing file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("backing file %s is not a regular file", path)
	}
	if st.Size() > size {
		return fmt.Errorf("backing file %s is %d bytes, larger than the volume (%d)", path, st.Size(), size)
	}
	return nil
}

// Open opens the replica in dir, deletes leftovers of interrupted
// operations and rebuilds the location map from the layer files.
func Open(dir string) (*Replica, error) {
	vol, err := loadVolumeMeta(dir)
	if err != nil {
		return nil, err
	}
	r := &Replica{
		dir: dir, vol: vol, size: vol.Size,
		slots: []*layer{nil}, snaps: make(map[string]*layer, len(vol.Snapshots)),
		scratch: make([]byte, 2*bs),
	}
	if err := r.load(); err != nil {
		r.closeFiles()
		return nil, err
	}
	if err := r.upgradeFormat(); err != nil {
		r.closeFiles()
		return nil, err
	}
	return r, nil
}

// upgradeFormat rewrites the volume.meta of an older format version as
// the current one (see formatVersion) before anything can use what the
// older version lacks.
func (r *Replica) upgradeFormat() error {
	if r.vol.FormatVersion >= formatVersion {
		return nil
	}
	vol := r.vol
	vol.FormatVersion = formatVersion
	renamed, err := commitVolumeMeta(r.dir, vol)
	if renamed {
		r.vol = vol
	}
	if err != nil {
		return fmt.Errorf("open replica %s: upgrade to format version %d: %w", r.dir, formatVersion, err)
	}
	return nil
}

func (r *Replica) load() error {
	if r.vol.BackingFile != "" {
		if err := checkBackingFile(r.vol.BackingFile, r.size); err != nil {
			return fmt.Errorf("open replica %s: %w", r.dir, err)
		}
		f, err := os.Open(r.vol.BackingFile)
		if err != nil {
			return fmt.Errorf("open replica %s: backing file: %w", r.dir, err)
		}
		r.backing = r.addLayer(&layer{kind: kindBacking, file: r.vol.BackingFile, f: f})
	}
	for _, name := range r.vol.Snapshots {
		img := snapFileName(name)
		m, err := loadLayerMeta(r.dir, img)
		if err != nil {
			return err
		}
		if m.Name != name {
			return fmt.Errorf("%w: %s: name %q, want %q", ErrBadMeta, filepath.Join(r.dir, img+metaSuffix), m.Name, name)
		}
		f, err := r.openLayerFile(img)
		if err != nil {
			return err
		}
		s := r.addLayer(&layer{kind: kindSnapshot, file: img, f: f, meta: m})
		r.snaps[name] = s
		if err := r.loadZeros(s); err != nil {
			return err
		}
	}
	m, err := loadLayerMeta(r.dir, r.vol.Head)
	if err != nil {
		return err
	}
	if m.Name != HeadName {
		return fmt.Errorf("%w: %s: name %q, want %q", ErrBadMeta, filepath.Join(r.dir, r.vol.Head+metaSuffix), m.Name, HeadName)
	}
	f, err := r.openLayerFile(r.vol.Head)
	if err != nil {
		return err
	}
	r.head = r.addLayer(&layer{kind: kindHead, file: r.vol.Head, f: f, meta: m})
	if err := r.loadZeros(r.head); err != nil {
		return err
	}
	if err := r.checkParents(); err != nil {
		return err
	}
	// Expand grows the head before committing the new size, and a crash
	// may lose the size of a just-created head; either way make it whole.
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("open replica %s: %w", r.dir, err)
	}
	if st.Size() < r.size {
		if err := f.Truncate(r.size); err != nil {
			return fmt.Errorf("open replica %s: grow %s: %w", r.dir, r.vol.Head, err)
		}
	}
	chain, err := r.chainBelow(r.head.meta.Parent)
	if err != nil {
		return err
	}
	r.owner, err = buildOwnerMap(chain, r.size)
	if err != nil {
		return fmt.Errorf("open replica %s: %w", r.dir, err)
	}
	r.headBits, err = buildHeadBits(r.head, r.size)
	if err != nil {
		return fmt.Errorf("open replica %s: %w", r.dir, err)
	}
	if err := r.removeLeftovers(); err != nil {
		return err
	}
	r.loadDiscarded()
	return r.tightenModes()
}

func (r *Replica) openLayerFile(img string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(r.dir, img), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: layer image of the chain: %w", ErrBadMeta, err)
	}
	return f, nil
}

// checkParents verifies every parent link names a snapshot of the replica
// and that the links have no cycle.
func (r *Replica) checkParents() error {
	check := func(img, parent string) error {
		if parent != "" && r.snaps[parent] == nil {
			return fmt.Errorf("%w: %s: parent %q is not a snapshot of the replica",
				ErrBadMeta, filepath.Join(r.dir, img+metaSuffix), parent)
		}
		return nil
	}
	if err := check(r.head.file, r.head.meta.Parent); err != nil {
		return err
	}
	for _, s := range r.snaps {
		if err := check(s.file, s.meta.Parent); err != nil {
			return err
		}
		steps := 0
		for p := s.meta.Parent; p != ""; p = r.snaps[p].meta.Parent {
			if steps++; steps > len(r.snaps) {
				return fmt.Errorf("%w: %s: parent links form a cycle", ErrBadMeta, filepath.Join(r.dir, s.file+metaSuffix))
			}
		}
	}
	return nil
}

// removeLeftovers deletes layer and temp files volume.meta does not
// reference: they belong to an operation that did not commit (or committed
// and had not yet deleted what it replaced).
func (r *Replica) removeLeftovers() error {
	keep := map[string]bool{r.head.file: true, r.head.file + metaSuffix: true, discardFileName(r.head.file): true,
		zeroFileName(r.head.file): true}
	for _, s := range r.snaps {
		keep[s.file] = true
		keep[s.file+metaSuffix] = true
		keep[zeroFileName(s.file)] = true
	}
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return fmt.Errorf("open replica %s: %w", r.dir, err)
	}
	removed := false
	for _, e := range entries {
		n := e.Name()
		if keep[n] || (!isLayerFile(n) && !isTmpFile(n)) {
			continue
		}
		if err := os.Remove(filepath.Join(r.dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("open replica %s: remove leftover: %w", r.dir, err)
		}
		removed = true
	}
	if removed {
		return syncDir(r.dir)
	}
	return nil
}

// crashHook, set only by the crash test, is called at the steps of a
// structural change where a crash leaves a distinct state on disk.
var crashHook func(point string)

func crashPoint(point string) {
	if crashHook != nil {
		crashHook(point)
	}
}

func (r *Replica) addLayer(l *layer) *layer {
	if n := len(r.free); n > 0 {
		l.slot = r.free[n-1]
		r.free = r.free[:n-1]
		r.slots[l.slot] = l
		return l
	}
	l.slot = uint16(len(r.slots))
	r.slots = append(r.slots, l)
	return l
}

func (r *Replica) freeSlot(l *layer) {
	r.slots[l.slot] = nil
	r.free = append(r.free, l.slot)
}

// chainBelow returns the layers under a head whose parent is parent,
// bottom first: the backing file, then the snapshots from the root up.
func (r *Replica) chainBelow(parent string) ([]*layer, error) {
	var chain []*layer
	for p := parent; p != ""; {
		s := r.snaps[p]
		if s == nil {
			return nil, fmt.Errorf("%w: snapshot %q missing from the chain", ErrBadMeta, p)
		}
		chain = append(chain, s)
		p = s.meta.Parent
	}
	if r.backing != nil {
		chain = append(chain, r.backing)
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	return chain, nil
}

// buildOwnerMap walks the layers bottom to top; the topmost holder of each
// block (data or zero mark) wins.
func buildOwnerMap(chain []*layer, size int64) (*ownerMap, error) {
	owner := newOwnerMap(size / bs)
	for _, l := range chain {
		exts, err := heldExtents(l, size, scanExtents)
		if err != nil {
			return nil, err
		}
		for _, e := range exts {
			owner.fill(e.Offset/bs, (e.Offset+e.Length)/bs, l.slot)
		}
	}
	return owner, nil
}

func buildHeadBits(head *layer, size int64) (*bitmap, error) {
	m := newBitmap(size / bs)
	exts, err := heldExtents(head, size, scanExtents)
	if err != nil {
		return nil, err
	}
	for _, e := range exts {
		m.set(e.Offset/bs, (e.Offset+e.Length)/bs)
	}
	return m, nil
}

// Size returns the volume size in bytes.
func (r *Replica) Size() int64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.size
}

// Dir returns the replica directory.
func (r *Replica) Dir() string { return r.dir }

// SetLimits bounds user snapshots: at most maxCount not marked removed, and
// no new one once snapshot layers take maxSize allocated bytes. 0 means no
// limit. Limits live in memory; set them again after Open.
func (r *Replica) SetLimits(maxCount int, maxSize int64) {
	// Under the I/O lock rather than opMu, so it does not wait for a purge.
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maxCount, r.maxSize = maxCount, maxSize
}

// Flush makes every acknowledged write durable. Structural changes sync
// their own files, so only the head's data and zero marks can be pending.
func (r *Replica) Flush() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return ErrClosed
	}
	if err := unix.Fdatasync(int(r.head.f.Fd())); err != nil {
		return fmt.Errorf("flush %s: %w", filepath.Join(r.dir, r.head.file), err)
	}
	if err := r.syncZeros(r.head); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// Close syncs the head and closes every file.
func (r *Replica) Close() error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	r.closeImport()
	r.closeDiscardFile()
	err := r.head.f.Sync()
	if serr := r.syncZeros(r.head); err == nil {
		err = serr
	}
	if cerr := r.closeFiles(); err == nil {
		err = cerr
	}
	return err
}

func (r *Replica) closeFiles() error {
	var first error
	for _, l := range r.slots {
		if l == nil {
			continue
		}
		if err := l.f.Close(); err != nil && first == nil {
			first = err
		}
		closeZeros(l)
	}
	return first
}
