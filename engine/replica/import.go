package replica

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Import: how a rebuild fills a new replica T with the snapshots of a
// healthy replica S while T's head keeps taking the volume's writes.
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
//     later partial write fills from zeros, as S does) and must write a zero
//     block if a lower layer turns out to hold the block.
//
// Whole-block writes clear all of it. Blocks the head never got need nothing:
// they read from the imported layers as they do on S. CommitImport resolves
// the records against the imported location map, mostly in short batches
// under the I/O lock, the rest under the lock of the commit itself.
//
// On disk, staged layers are temp files (".import-<name>.img.tmp"). The
// commit fsyncs them, renames them and writes their .meta, hard-links the
// head under the next head name with a .meta naming its new parent, and then
// replaces volume.meta: the commit point, as for every structural change.
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
}

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

// importState is a running import. The maps and bitmaps change only under
// the replica's exclusive I/O lock; the bitmaps are read with atomic loads
// under the shared lock, so the write fast path can see it must not run.
type importState struct {
	mu      sync.Mutex // staging files
	staging map[string]*os.File
	done    bool // committed or aborted: no more writes

	recs     map[int64]*blockRec
	recBits  []uint64 // a record exists
	unmapped []uint64 // trimmed, nothing written since, no record needed
	zeroed   []uint64 // WriteZeroes'd and freed, nothing written since
	noFree   bool     // a backing file: WriteZeroes writes zero blocks instead
	err      error    // too many records: the import cannot commit
}

func stagingName(layer string) string { return tmpName("import-" + layer + imgSuffix) }

// BeginImport prepares a new replica to be rebuilt: it must have no
// snapshots and an empty head. An import left unfinished by an earlier
// rebuild is dropped and its head data discarded: a replica that never
// completed an import holds nothing worth keeping.
func (r *Replica) BeginImport() error {
	r.opMu.Lock()
	defer r.opMu.Unlock()
	if r.closed {
		return ErrClosed
	}
	restart := r.imp != nil
	if restart {
		r.dropImport()
	} else if len(r.snaps) > 0 || r.head.meta.Parent != "" {
		return fmt.Errorf("begin import: %w: it has %d snapshots", ErrNotEmpty, len(r.snaps))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	nblocks := r.size / bs
	if runEnd(r.headBits, 0, nblocks, false) < nblocks {
		if !restart {
			return fmt.Errorf("begin import: %w: its head holds data", ErrNotEmpty)
		}
		if err := r.punchHead(0, nblocks); err != nil {
			return fmt.Errorf("begin import: %w", err)
		}
	}
	words := len(r.headBits)
	r.imp = &importState{
		staging: map[string]*os.File{}, recs: map[int64]*blockRec{},
		recBits: make([]uint64, words), unmapped: make([]uint64, words), zeroed: make([]uint64, words),
		noFree: r.backing != nil,
	}
	return nil
}

// Importing reports whether an import runs.
func (r *Replica) Importing() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.imp != nil
}

// ImportWrite writes data of snapshot layer into its staging file. off and
// len(p) must be block-aligned. Every block written is held by the layer,
// zeros included: a zero block hides what lower layers hold.
func (r *Replica) ImportWrite(layer string, p []byte, off int64) error {
	if err := ValidateSnapshotName(layer); err != nil {
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
	if _, err := f.WriteAt(p, off); err != nil {
		return fmt.Errorf("import write to %s at %d: %w", layer, off, err)
	}
	crashPoint("import:write")
	return nil
}

// stagingFile opens (creating) a layer's staging file; the caller holds imp.mu.
func (imp *importState) stagingFile(dir, layer string, size int64) (*os.File, error) {
	if f := imp.staging[layer]; f != nil {
		return f, nil
	}
	path := filepath.Join(dir, stagingName(layer))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
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

// importMarked reports whether any block of [b, e) has import state that a
// write must update, which the lock-free write path cannot do. The caller
// holds the I/O lock (shared is enough).
func (r *Replica) importMarked(b, e int64) bool {
	imp := r.imp
	if imp == nil {
		return false
	}
	for _, w := range [][]uint64{imp.recBits, imp.unmapped, imp.zeroed} {
		if runEnd(w, b, e, false) < e {
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
	setBits(imp.recBits, b, b+1)
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
		b = runEnd(imp.recBits, b, e, false)
		if b >= e {
			break
		}
		end := runEnd(imp.recBits, b, e, true)
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
		clearBits(imp.recBits, b, end)
		b = end
	}
}

// wholeBlocks forgets everything about [b, e): they were written whole.
func (imp *importState) wholeBlocks(b, e int64) {
	imp.forget(b, e)
	clearBits(imp.unmapped, b, e)
	clearBits(imp.zeroed, b, e)
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
		if isSet(imp.zeroed, b) {
			// The head lacks it and T has nothing below: the write fills the
			// rest with zeros, which is the block's content on S too.
			clearBits(imp.zeroed, b, b+1)
			return
		}
		var rec *blockRec
		if isSet(imp.recBits, b) {
			rec = imp.recs[b]
		}
		if !r.headHas(b) {
			// Read-modify-write from layers T does not have yet.
			if rec == nil {
				rec = imp.rec(b)
			}
			rec.tainted, rec.valid = true, nil
		}
		if isSet(imp.unmapped, b) {
			clearBits(imp.unmapped, b, b+1)
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

func isSet(words []uint64, b int64) bool {
	return words[b>>6]&(1<<uint(b&63)) != 0
}

// noteImportUnmap records a trim of the whole blocks [b, e) instead of
// punching them. Blocks the head lacks read the same on T and S whatever
// the lower layers, so only head blocks are marked.
func (r *Replica) noteImportUnmap(b, e int64) {
	imp := r.imp
	for b < e {
		b = runEnd(r.headBits, b, e, false)
		if b >= e {
			break
		}
		end := runEnd(r.headBits, b, e, true)
		setBits(imp.unmapped, b, end)
		for x := b; x < end; {
			x = runEnd(imp.recBits, x, end, false)
			if x >= end {
				break
			}
			rend := runEnd(imp.recBits, x, end, true)
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
		// A lower layer (the backing file) may hold the blocks: write zeros.
		for pos, end := b*bs, e*bs; pos < end; {
			n := min(end-pos, int64(len(zeroBuf)))
			if _, err := r.head.f.WriteAt(zeroBuf[:n], pos); err != nil {
				return fmt.Errorf("write %s at %d: %w", r.head.file, pos, err)
			}
			pos += n
		}
		setBits(r.headBits, b, e)
		return nil
	}
	for x := b; x < e; {
		x = runEnd(r.headBits, x, e, false)
		if x >= e {
			break
		}
		end := runEnd(r.headBits, x, e, true)
		if err := r.punchHead(x, end); err != nil {
			return err
		}
		x = end
	}
	setBits(imp.zeroed, b, e)
	return nil
}

// CommitImport makes the staged layers T's snapshots, with the head on top
// of headParent, and ends the import. layers must form a tree: every parent
// named is in the list. A layer with no staged data is an empty layer. On
// any error before the commit point the import is aborted and the chain is
// as it was.
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
	if len(r.slots)+len(names) > maxSnapshots+2 {
		return fmt.Errorf("%w: %d imported layers", ErrTooManyLayers, len(names))
	}
	if r.vol.HeadIndex >= maxHeadIndex {
		return fmt.Errorf("head index %d exhausted", r.vol.HeadIndex)
	}

	// Stage 1: the layer files under their final names, durable. Nothing
	// references them until volume.meta does.
	imp.mu.Lock()
	imp.done = true
	staging = imp.staging
	imp.staging = nil
	imp.mu.Unlock()
	base := len(r.slots)
	for i, name := range names {
		img := snapFileName(name)
		f := staging[name]
		delete(staging, name)
		if f == nil {
			f, err = os.OpenFile(filepath.Join(r.dir, stagingName(name)), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
		}
		newLayers = append(newLayers, &layer{slot: uint16(base + i), kind: kindSnapshot, file: img, f: f, meta: metas[name]})
		extra = append(extra, stagingName(name), img, img+metaSuffix)
		if err := f.Truncate(r.size); err != nil {
			return fmt.Errorf("staged %s: %w", name, err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("sync staged %s: %w", name, err)
		}
		r.removeFiles(img, img+metaSuffix) // unreferenced, so leftovers
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
	for _, l := range newLayers {
		r.slots = append(r.slots, l)
		r.snaps[l.meta.Name] = l
	}
	r.owner = owner
	r.imp = nil
	if err != nil {
		// volume.meta was replaced but maybe not durably: follow it.
		return fmt.Errorf("commit import: %w", err)
	}
	crashPoint("import:committed")
	r.removeFiles(oldHead, oldHead+metaSuffix)
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
		if err := ValidateSnapshotName(l.Name); err != nil {
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
			Created: formatTime(created), Labels: maps.Clone(l.Labels)}
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

// importFixer resolves an import's records against the imported location
// map: afterwards every head block holds what S's head holds.
type importFixer struct {
	r     *Replica
	imp   *importState
	owner []uint16
	lower map[uint16]*layer
	buf   []byte // two blocks
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
	for i := range imp.recBits {
		w := imp.recBits[i] | imp.unmapped[i] | imp.zeroed[i]
		for w != 0 {
			b := int64(i)*64 + int64(bits.TrailingZeros64(w))
			w &= w - 1
			if n := len(out); n > 0 && out[n-1].End() == b {
				out[n-1].Length++
				continue
			}
			out = append(out, Extent{Offset: b, Length: 1})
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
	return nil
}

// block settles one block: its content becomes what S's head holds, given
// that S's lower layers are f.owner.
func (f *importFixer) block(b int64) error {
	r, imp := f.r, f.imp
	lowerData := f.owner[b] != 0
	var rec *blockRec
	if isSet(imp.recBits, b) {
		rec = imp.recs[b]
	}
	unmapped, zeroed := isSet(imp.unmapped, b), isSet(imp.zeroed, b)
	clearBits(imp.unmapped, b, b+1)
	clearBits(imp.zeroed, b, b+1)
	imp.forget(b, b+1)
	switch {
	case zeroed:
		// Freed by WriteZeroes: S wrote a zero block where a lower layer
		// holds data (and freed it otherwise).
		if lowerData {
			return f.writeHead(b, zeroBuf[:bs])
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
		if err := readFull(f.lower[f.owner[b]].f, out, b*bs); err != nil {
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
	setBits(r.headBits, b, b+1)
	return nil
}
