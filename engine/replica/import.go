package replica

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/types"
)

// Import: how a rebuild fills a replica T with the snapshots of a healthy
// replica S while T's head keeps taking the volume's writes. T is new, or
// a replica that came back with snapshots of its own, some of which it
// keeps (see import_reuse.go); the rest of this comment is about what is
// copied.
//
// The engine calls BeginImport on T, then, between two writes, snapshots S
// (and every other healthy replica) and attaches T, so from that point S's
// head and T's head receive the same writes in the same order. T copies every
// snapshot layer of S into staging files (ImportWrite), and CommitImport puts
// them under T's head in one step.
//
// T cannot apply every write as S does while it lacks S's lower layers: a
// partial-block write on a block its head lacks fills the rest of the block
// from below (S reads its snapshots, T has nothing), and Unmap and
// WriteZeroes punch head blocks only where no lower layer holds the block.
// So during an import T never punches, and it records, per block, what it
// needs to end up where S is once the lower layers are known:
//
//   - taint: the head took the block from a partial write; only the bytes
//     written since ("valid") are real, the rest must come from below;
//   - unmap: the block was trimmed; S freed it if no lower layer holds it
//     (it then reads zeros, plus what was written since, "since");
//   - zeroed: WriteZeroes; T frees the block (it has no backing file, so a
//     later partial write fills from zeros, as S does) and must zero-mark
//     it (zeromarks.go) if a lower layer turns out to hold the block. With
//     a backing file T marks the block at once, as S marks it over any
//     lower data.
//
// Whole-block writes clear all of it. Blocks the head never got need nothing:
// they read from the imported layers as they do on S. CommitImport resolves
// the records against the imported location map, mostly in short batches
// under the I/O lock, the rest under the lock of the commit itself.
//
// On disk, staged layers are temp files (".import-<name>.img.tmp"). The
// commit fsyncs them, renames them and writes their .meta, hard-links the
// head (and its zero marks) under the next head name with a .meta naming
// its new parent, and then replaces volume.meta: the commit point, as for
// every structural change. Zero blocks received for a layer are kept as its
// zero marks, written under the layer's final name with it.
// Before it, Open sees a head-only replica and deletes the rest as
// leftovers; after it, the imported chain. The old head names go last.

var (
	// ErrImporting: the operation is refused while an import (rebuild) runs.
	ErrImporting = errors.New("replica is being rebuilt")
	// ErrNotImporting: an import call without BeginImport.
	ErrNotImporting = errors.New("no import in progress")
	// ErrNotEmpty: BeginImport on a replica that holds data or snapshots.
	ErrNotEmpty = errors.New("replica is not empty")
	// ErrBadImport: import data that is not whole blocks inside the volume.
	ErrBadImport = errors.New("bad import data")
)

// maxImportRecords bounds the per-block records (taint and unmap-since byte
// ranges) an import keeps in memory; past it the import fails at commit.
// Whole-block writes need none, so real workloads stay far below it.
var maxImportRecords = 1 << 20

// ImportLayer describes one snapshot of an imported chain.
type ImportLayer struct {
	Name        string
	Parent      string
	Removed     bool
	UserCreated bool
	Created     time.Time
	Labels      map[string]string
	// ID is the source's ID of the layer (see layerid.go).
	ID string
	// Keep: the replica's own snapshot of this name, which must have this
	// same non-empty ID, becomes the layer; no data was staged for it.
	Keep bool
}

// importState is a running import. The maps and bitmaps change only under
// the replica's exclusive I/O lock; the bitmaps are read with atomic loads
// under the shared lock, so the write fast path can see it must not run.
type importState struct {
	mu      sync.Mutex // staging files and marks
	staging map[string]*os.File
	// zeros: per staged layer, the zero blocks received, kept as zero
	// marks (zeromarks.go) instead of data; written out by the commit.
	zeros map[string]*bitmap
	done  bool // committed or aborted: no more writes

	recs     map[int64]*blockRec
	recBits  *bitmap // a record exists
	unmapped *bitmap // trimmed, nothing written since, no record needed
	zeroed   *bitmap // WriteZeroes'd and freed, nothing written since
	noFree   bool    // a backing file: WriteZeroes zero-marks blocks instead
	err      error   // too many records: the import cannot commit
}

func stagingName(layer string) string { return tmpName("import-" + layer + imgSuffix) }

// ImportOptions configure BeginImport.
type ImportOptions struct {
	// Reuse accepts a replica that is not empty: its head is replaced by an
	// empty one at the root of the chain (committed, so its old data is
	// gone), and its snapshots stay, untouched, until CommitImport keeps
	// those the source also has (same name and ID) and drops the rest.
	// Without Reuse such a replica is refused with ErrNotEmpty.
	Reuse bool
}

// BeginImport prepares a replica to be rebuilt. A new replica must have no
// snapshots and an empty head, unless opts.Reuse (see ImportOptions). An
// import left unfinished by an earlier rebuild is dropped and its head
// data discarded: a replica that never completed an import holds nothing
// worth keeping in its head.
func (r *Replica) BeginImport(opts ImportOptions) error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if r.closed {
		return ErrClosed
	}
	restart := r.imp != nil
	if restart {
		r.dropImport()
	} else if len(r.snaps) > 0 || r.head.meta.Parent != "" || r.headHolds() {
		if !opts.Reuse {
			return fmt.Errorf("begin import: %w: it has %d snapshots or data in its head", ErrNotEmpty, len(r.snaps))
		}
		// The head is stale: the import rebuilds it from the writes the
		// engine sends from the rebuild snapshot on, like a new replica's.
		if err := r.replaceHead("", "import-reset"); err != nil {
			return fmt.Errorf("begin import: %w", err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	nblocks := r.size / bs
	if restart && r.headHoldsLocked() {
		if err := r.punchHead(0, nblocks); err != nil {
			return fmt.Errorf("begin import: %w", err)
		}
	}
	if restart {
		r.dropHeadZeros()
	}
	r.discarded.clearAll() // the head is rebuilt; so are its marks
	r.dropDiscardFile()
	r.imp = &importState{
		staging: map[string]*os.File{}, zeros: map[string]*bitmap{}, recs: map[int64]*blockRec{},
		recBits: newBitmap(nblocks), unmapped: newBitmap(nblocks), zeroed: newBitmap(nblocks),
		noFree: r.backing != nil,
	}
	return nil
}

func (r *Replica) headHolds() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.headHoldsLocked()
}

func (r *Replica) headHoldsLocked() bool {
	nblocks := r.size / bs
	return r.headBits.runEnd(0, nblocks, false) < nblocks
}

// Importing reports whether an import runs.
func (r *Replica) Importing() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.imp != nil
}

// ImportWrite writes data of snapshot layer into its staging file. off and
// len(p) must be block-aligned. Every block written is held by the layer,
// zeros included: a zero block hides what lower layers hold. Zero blocks
// are kept as zero marks, not data (zeromarks.go): a rebuild allocates no
// more than the source, where they are marks (or zeros a user wrote).
func (r *Replica) ImportWrite(layer string, p []byte, off int64) error {
	if err := types.ValidateSnapshotName(layer); err != nil {
		return fmt.Errorf("import write: %w", err)
	}
	r.mu.RLock()
	imp, size, closed := r.imp, r.size, r.closed
	r.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	if imp == nil {
		return fmt.Errorf("import write: %w", ErrNotImporting)
	}
	if off%bs != 0 || len(p)%bs != 0 || off < 0 || off > size-int64(len(p)) {
		return fmt.Errorf("import write to %s: offset %d length %d: %w: not whole blocks inside the volume (%d bytes)",
			layer, off, len(p), ErrBadImport, size)
	}
	imp.mu.Lock()
	defer imp.mu.Unlock()
	if imp.done {
		return fmt.Errorf("import write: %w", ErrNotImporting)
	}
	f, err := imp.stagingFile(r.dir, layer, size)
	if err != nil {
		return err
	}
	for len(p) > 0 {
		zero := isZeroBlock(p[:bs])
		n := int64(bs)
		for n < int64(len(p)) && isZeroBlock(p[n:n+bs]) == zero {
			n += bs
		}
		if zero {
			err = imp.stageZeros(f, layer, size, off, n)
		} else if _, err = f.WriteAt(p[:n], off); err != nil {
			err = fmt.Errorf("import write to %s at %d: %w", layer, off, err)
		}
		if err != nil {
			return err
		}
		p, off = p[n:], off+n
	}
	crashPoint("import:write")
	return nil
}

func isZeroBlock(p []byte) bool { return bytes.Equal(p, zeroBuf[:bs]) }

// stageZeros records n bytes at off of a staged layer as zero marks; data
// staged there before is punched, since data wins over a mark. The caller
// holds imp.mu.
func (imp *importState) stageZeros(f *os.File, layer string, size, off, n int64) error {
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err != nil {
		return fmt.Errorf("import write to %s at %d: punch: %w", layer, off, err)
	}
	m := imp.zeros[layer]
	if m == nil {
		m = newBitmap(size / bs)
		imp.zeros[layer] = m
	}
	m.set(off/bs, (off+n)/bs)
	return nil
}

// stagingFile opens (creating) a layer's staging file; the caller holds imp.mu.
func (imp *importState) stagingFile(dir, layer string, size int64) (*os.File, error) {
	if f := imp.staging[layer]; f != nil {
		return f, nil
	}
	path := filepath.Join(dir, stagingName(layer))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, fileMode)
	if err == nil {
		if err = f.Truncate(size); err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("import: staging file for %s: %w", layer, err)
	}
	imp.staging[layer] = f
	return f, nil
}

// AbortImport ends an import without changing the chain and deletes its
// staging files. The head keeps what it was written.
func (r *Replica) AbortImport() error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	r.dropImport()
	return nil
}

// dropImport forgets the running import, if any; the caller holds opMu.
func (r *Replica) dropImport() {
	r.mu.Lock()
	imp := r.imp
	r.imp = nil
	r.mu.Unlock()
	if imp == nil {
		return
	}
	imp.mu.Lock()
	defer imp.mu.Unlock()
	imp.done = true
	for name, f := range imp.staging {
		f.Close()
		if !r.closed {
			r.removeFiles(stagingName(name))
		}
	}
	imp.staging = nil
}

// closeImport closes staging files at Close; Open deletes them.
func (r *Replica) closeImport() {
	if r.imp == nil {
		return
	}
	r.imp.mu.Lock()
	defer r.imp.mu.Unlock()
	r.imp.done = true
	for _, f := range r.imp.staging {
		f.Close()
	}
	r.imp.staging = nil
}

// checkNotImporting refuses structural changes during an import.
func (r *Replica) checkNotImporting() error {
	if r.imp != nil {
		return ErrImporting
	}
	return nil
}

// CommitImport makes the staged layers, and the replica's own kept ones
// (ImportLayer.Keep), its snapshots, with the head on top of headParent,
// and ends the import; its other snapshots are dropped. layers must form
// a tree: every parent named is in the list. A layer with no staged data
// is an empty layer. On any error before the commit point the import is
// aborted and the chain is as it was (a reused replica may have lost its
// own snapshots, see import_reuse.go).
func (r *Replica) CommitImport(layers []ImportLayer, headParent string) (err error) {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if r.closed {
		return ErrClosed
	}
	imp := r.imp
	if imp == nil {
		return fmt.Errorf("commit import: %w", ErrNotImporting)
	}
	committed := false
	var newLayers []*layer
	var staging map[string]*os.File // staged files not moved yet
	var extra []string              // files to delete if the commit does not happen
	defer func() {
		if committed {
			return
		}
		for _, l := range newLayers {
			l.f.Close()
			closeZeros(l)
		}
		for name, f := range staging {
			f.Close()
			extra = append(extra, stagingName(name))
		}
		r.removeFiles(extra...)
		r.dropImport()
		err = fmt.Errorf("commit import: %w", err)
	}()

	metas, names, err := importMetas(layers, headParent)
	if err != nil {
		return err
	}
	keep, err := r.checkKept(layers)
	if err != nil {
		return err
	}
	if r.vol.HeadIndex >= maxHeadIndex {
		return fmt.Errorf("head index %d exhausted", r.vol.HeadIndex)
	}
	imp.mu.Lock()
	imp.done = true
	staging = imp.staging
	imp.staging = nil
	zeros := imp.zeros
	imp.zeros = nil
	imp.mu.Unlock()
	for name := range keep {
		if staging[name] != nil {
			return fmt.Errorf("%w: layer %q is both kept and imported", ErrBadMeta, name)
		}
	}

	// Stage 0, for a reused replica: its own snapshots leave the chain,
	// those kept under their staging names (see dropOwnSnapshots).
	if len(r.snaps) > 0 {
		moved, err := r.dropOwnSnapshots(keep, zeros, &extra)
		maps.Copy(staging, moved)
		if err != nil {
			return err
		}
	}

	// Stage 1: the layer files under their final names, durable. Nothing
	// references them until volume.meta does.
	slots := r.slotAllocator()
	for _, name := range names {
		img := snapFileName(name)
		f := staging[name]
		delete(staging, name)
		slot, err := slots.next()
		if err != nil {
			if f != nil {
				f.Close()
			}
			return err
		}
		if f == nil {
			f, err = os.OpenFile(filepath.Join(r.dir, stagingName(name)), os.O_RDWR|os.O_CREATE|os.O_TRUNC, fileMode)
			if err != nil {
				return err
			}
		}
		l := &layer{slot: slot, kind: kindSnapshot, file: img, f: f, meta: metas[name]}
		newLayers = append(newLayers, l)
		extra = append(extra, stagingName(name), img, img+metaSuffix, zeroFileName(img))
		if err := f.Truncate(r.size); err != nil {
			return fmt.Errorf("staged %s: %w", name, err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("sync staged %s: %w", name, err)
		}
		r.removeFiles(img, img+metaSuffix, zeroFileName(img)) // unreferenced, so leftovers
		if err := r.writeStagedZeros(l, zeros[name]); err != nil {
			return err
		}
		if err := writeLayerMeta(r.dir, img, metas[name]); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(r.dir, stagingName(name)), filepath.Join(r.dir, img)); err != nil {
			return err
		}
	}
	for name, f := range staging { // staged but not in the chain
		f.Close()
		r.removeFiles(stagingName(name))
	}
	staging = nil
	crashPoint("import:layers")

	// Stage 2: the next head name, linked to the live head, with a .meta
	// naming its new parent.
	newIndex := r.vol.HeadIndex + 1
	newHead := headFileName(newIndex)
	newHeadMeta := r.head.meta
	newHeadMeta.Parent = headParent
	r.removeFiles(newHead, newHead+metaSuffix)
	extra = append(extra, newHead, newHead+metaSuffix)
	if err := os.Link(filepath.Join(r.dir, r.head.file), filepath.Join(r.dir, newHead)); err != nil {
		return err
	}
	if err := writeLayerMeta(r.dir, newHead, newHeadMeta); err != nil {
		return err
	}
	if err := syncDir(r.dir); err != nil {
		return err
	}
	crashPoint("import:prepared")

	// Stage 3: the location map of the imported chain (immutable files, so
	// no lock), then the records resolved against it.
	byName := make(map[string]*layer, len(newLayers))
	for _, l := range newLayers {
		byName[l.meta.Name] = l
	}
	var chain []*layer
	for p := headParent; p != ""; p = byName[p].meta.Parent {
		chain = append(chain, byName[p])
	}
	if r.backing != nil {
		chain = append(chain, r.backing)
	}
	slices.Reverse(chain)
	owner, err := buildOwnerMap(chain, r.size)
	if err != nil {
		return err
	}
	lower := make(map[uint16]*layer, len(chain))
	for _, l := range chain {
		lower[l.slot] = l
	}
	fix := &importFixer{r: r, imp: imp, owner: owner, lower: lower, buf: make([]byte, 2*bs)}
	if err := fix.prepass(); err != nil {
		return err
	}
	if err := unix.Fdatasync(int(r.head.f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", r.head.file, err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if imp.err != nil {
		return imp.err
	}
	if err := fix.all(); err != nil {
		return err
	}
	if err := unix.Fdatasync(int(r.head.f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", r.head.file, err)
	}
	if r.head.zeroF != nil {
		// The head's marks go with its data, under the next head's name.
		// Made now, under the lock, so no write-zeroes comes in between.
		extra = append(extra, zeroFileName(newHead))
		r.removeFiles(zeroFileName(newHead))
		err := r.syncZeros(r.head)
		if err == nil {
			err = os.Link(filepath.Join(r.dir, zeroFileName(r.head.file)), filepath.Join(r.dir, zeroFileName(newHead)))
		}
		if err == nil {
			err = syncDir(r.dir)
		}
		if err != nil {
			return err
		}
	}
	crashPoint("import:fixed")
	vol := r.vol
	vol.Head, vol.HeadIndex = newHead, newIndex
	vol.Snapshots = slices.Sorted(maps.Keys(byName))
	renamed, err := commitVolumeMeta(r.dir, vol)
	if !renamed {
		return err
	}
	committed = true
	r.vol = vol
	oldHead := r.head.file
	r.head.file, r.head.meta = newHead, newHeadMeta
	slots.commit(newLayers)
	r.owner = owner
	r.imp = nil
	if err != nil {
		// volume.meta was replaced but maybe not durably: follow it.
		return fmt.Errorf("commit import: %w", err)
	}
	crashPoint("import:committed")
	r.removeFiles(oldHead, oldHead+metaSuffix, zeroFileName(oldHead))
	return nil
}

// importMetas validates an imported chain and returns its .meta contents
// and its names, sorted.
func importMetas(layers []ImportLayer, headParent string) (map[string]layerMeta, []string, error) {
	if len(layers) > maxSnapshots {
		return nil, nil, fmt.Errorf("%w: %d layers", ErrTooManyLayers, len(layers))
	}
	metas := make(map[string]layerMeta, len(layers))
	for _, l := range layers {
		if err := types.ValidateSnapshotName(l.Name); err != nil {
			return nil, nil, err
		}
		if _, dup := metas[l.Name]; dup {
			return nil, nil, fmt.Errorf("%w: layer %q listed twice", ErrBadMeta, l.Name)
		}
		created := l.Created
		if created.IsZero() {
			created = time.Now()
		}
		m := layerMeta{Name: l.Name, Parent: l.Parent, Removed: l.Removed, UserCreated: l.UserCreated,
			Created: formatTime(created), Labels: maps.Clone(l.Labels), ID: l.ID}
		if err := m.validate(); err != nil {
			return nil, nil, fmt.Errorf("%w: layer %q: %w", ErrBadMeta, l.Name, err)
		}
		metas[l.Name] = m
	}
	for name, m := range metas {
		steps := 0
		for p := m.Parent; p != ""; p = metas[p].Parent {
			if _, ok := metas[p]; !ok {
				return nil, nil, fmt.Errorf("%w: layer %q: parent %q is not imported", ErrBadMeta, name, p)
			}
			if steps++; steps > len(metas) {
				return nil, nil, fmt.Errorf("%w: layer %q: parent links form a cycle", ErrBadMeta, name)
			}
		}
	}
	if _, ok := metas[headParent]; headParent != "" && !ok {
		return nil, nil, fmt.Errorf("%w: head parent %q is not imported", ErrBadMeta, headParent)
	}
	return metas, slices.Sorted(maps.Keys(metas)), nil
}
