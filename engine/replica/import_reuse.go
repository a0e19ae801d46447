package replica

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// Reuse of a replica that is not empty (ImportOptions.Reuse): a replica
// that failed comes back with the snapshots it had, most of which the
// source still has. BeginImport replaces its head (stale) by an empty one
// at the root and leaves its snapshots as they are; the engine compares the
// chains and stages only the source's layers the replica lacks (by name and
// ID, see layerid.go). CommitImport then:
//
//  0. links each kept snapshot's image to its staging name, syncs the
//     directory, and commits a volume.meta with the head alone; the old
//     names then go. From here the kept images are staged files like the
//     copied ones.
//  1. goes on as for a new replica: every layer of the source's chain
//     under its final name with the source's metadata, then the head,
//     then volume.meta naming them all.
//
// Two commits, because a snapshot's file names are its name's: a layer
// the replica has under a name the source's chain gives other content
// must leave the chain before the staged one can take the name. Crash
// safety: before stage 0's commit the replica opens with its own
// snapshots and the new head (the next rebuild can still keep them);
// between the two commits with its head alone (Open deletes the staged
// and kept files); after stage 1's commit with the imported chain.

// checkKept returns the names of the layers to keep, checking that the
// replica has each with the ID the source gives it.
func (r *Replica) checkKept(layers []ImportLayer) (map[string]bool, error) {
	keep := map[string]bool{}
	for _, l := range layers {
		if !l.Keep {
			continue
		}
		s := r.snaps[l.Name]
		switch {
		case s == nil:
			return nil, fmt.Errorf("%w: layer %q to keep: the replica has no such snapshot", ErrBadImport, l.Name)
		case l.ID == "" || s.meta.ID != l.ID:
			return nil, fmt.Errorf("%w: layer %q to keep: id %q, the replica's is %q", ErrBadImport, l.Name, l.ID, s.meta.ID)
		}
		keep[l.Name] = true
	}
	if len(r.snaps) > 0 && r.head.meta.Parent != "" {
		// BeginImport puts the head at the root; nothing else can move it.
		return nil, fmt.Errorf("head on %q during an import", r.head.meta.Parent)
	}
	return keep, nil
}

// dropOwnSnapshots is stage 0: every snapshot of the replica leaves the
// chain; the kept ones' open files are returned by name, linked under
// their staging names, and their zero marks put into zeros, to be written
// out with the staged layers'. Files it creates are added to extra, for
// the caller to delete if the import does not commit. Files are returned
// also with an error once the snapshots are gone, for the caller to close.
func (r *Replica) dropOwnSnapshots(keep map[string]bool, zeros map[string]*bitmap, extra *[]string) (map[string]*os.File, error) {
	for name := range keep {
		s := r.snaps[name]
		st := stagingName(name)
		r.removeFiles(st)
		if err := os.Link(filepath.Join(r.dir, s.file), filepath.Join(r.dir, st)); err != nil {
			return nil, fmt.Errorf("keep %s: %w", s.file, err)
		}
		*extra = append(*extra, st)
	}
	if err := syncDir(r.dir); err != nil {
		return nil, err
	}
	crashPoint("import:kept")
	vol := r.volMeta()
	vol.Snapshots = []string{}
	r.mu.Lock()
	renamed, err := commitVolumeMeta(r.dir, vol)
	if !renamed {
		r.mu.Unlock()
		return nil, err
	}
	r.vol = vol
	old := r.snaps
	r.snaps = map[string]*layer{}
	moved := map[string]*os.File{}
	for name, s := range old {
		r.freeSlot(s) // the head is at the root: no block maps to s
		closeZeros(s)
		if keep[name] {
			moved[name] = s.f
			zeros[name] = s.zeros
		} else {
			s.f.Close()
		}
	}
	r.mu.Unlock()
	if err != nil {
		return moved, err
	}
	crashPoint("import:dropped")
	for _, s := range old {
		r.removeFiles(s.file, s.file+metaSuffix, zeroFileName(s.file))
	}
	return moved, nil
}

// slotAlloc hands out slots for the layers of a commit before they join
// the replica: free ones first, then new ones.
type slotAlloc struct {
	r    *Replica
	free []uint16
	n    int // len(r.slots) once committed
}

// slotAllocator starts allocating; the caller holds opMu.
func (r *Replica) slotAllocator() *slotAlloc {
	return &slotAlloc{r: r, free: slices.Clone(r.free), n: len(r.slots)}
}

func (a *slotAlloc) next() (uint16, error) {
	if k := len(a.free); k > 0 {
		s := a.free[k-1]
		a.free = a.free[:k-1]
		return s, nil
	}
	if a.n > math.MaxUint16 {
		return 0, fmt.Errorf("%w: no slot left in the location map", ErrTooManyLayers)
	}
	a.n++
	return uint16(a.n - 1), nil
}

// commit puts the snapshot layers into the replica; the caller holds opMu
// and the exclusive I/O lock.
func (a *slotAlloc) commit(ls []*layer) {
	r := a.r
	for len(r.slots) < a.n {
		r.slots = append(r.slots, nil)
	}
	for _, l := range ls {
		r.slots[l.slot] = l
		r.snaps[l.meta.Name] = l
	}
	r.free = a.free
}
