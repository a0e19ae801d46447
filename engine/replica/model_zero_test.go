package replica

import (
	"fmt"
	"path/filepath"
	"slices"
)

// Model test checks of zero marks (zeromarks.go): write-zeroes and unmap
// never allocate data for whole blocks, Extents and ReadLayer read every
// layer as the volume reads it, and a rebuild reads the same.

// headData is the bytes of data the head's image holds.
func (h *harness) headData(what string) int64 {
	h.t.Helper()
	exts, err := dataExtents(h.r.head.f, h.r.Size())
	h.noErr(err, what+": head extents")
	return extentBytes(exts)
}

// checkZeroesAllocateNothing: after WriteZeroes(off, length) the head's
// image has no data in the whole blocks of the range: a block with
// nothing below is punched, one a lower layer holds is a zero mark.
func (h *harness) checkZeroesAllocateNothing(off, length int64, what string) {
	h.t.Helper()
	first, stop := (off+bs-1)/bs, (off+length)/bs
	if first >= stop {
		return
	}
	exts, err := dataExtentsIn(h.r.head.f, first*bs, stop*bs)
	h.noErr(err, what+": head extents")
	if len(exts) > 0 {
		h.fatalf("%s: write-zeroes %d+%d left data in the head at %v", what, off, length, exts)
	}
}

// verifyLayerReads reads the head and every snapshot not removed the way
// export and clone do, layer by layer through Extents and ReadLayer (the
// topmost layer holding a block gives it), and compares with the model.
func (h *harness) verifyLayerReads(what string) {
	h.t.Helper()
	check := func(name string, want []byte, known []bool) {
		h.t.Helper()
		got := make([]byte, h.r.Size())
		h.noErr(readChain(h.r, name, got), what+": read "+name+" by layers")
		for i := range got {
			w, k := byte(0), true // past a snapshot's size: zeros
			if i < len(want) {
				w, k = want[i], known[i]
			}
			if got[i] != w && (k || got[i] != 0) {
				h.fatalf("%s: %s read by layers: byte %d (block %d): got %#x, want %#x", what, name, i, i/bs, got[i], w)
			}
		}
	}
	dev := make([]byte, h.m.dev.Size())
	h.m.dev.ReadAt(dev, 0)
	check(HeadName, dev, h.m.known)
	for _, n := range h.snapNames(func(s *modelSnap) bool { return !s.removed }) {
		s := h.m.snaps[n]
		p := make([]byte, s.dev.Size())
		s.dev.ReadAt(p, 0)
		check(n, p, s.known)
	}
}

// rebuild takes a system snapshot, as an engine does to rebuild, copies
// the replica's snapshots into a new replica through an import as the
// engine's rebuild does, and goes on with the new one. The copy must not
// hold more data than the source (zero blocks travel as marks).
func (h *harness) rebuild(what string, i int) {
	h.t.Helper()
	m := h.m
	name := fmt.Sprintf("rb%d", h.nextID)
	h.nextID++
	h.log("rebuild onto a new replica (snapshot %s)", name)
	h.noErr(h.r.Snapshot(name, SnapshotOptions{}), what+": rebuild snapshot")
	m.snaps[name] = &modelSnap{parent: m.headParent, dev: copyMem(m.dev), known: slices.Clone(m.known)}
	m.headParent = name
	dir := filepath.Join(filepath.Dir(h.dir), fmt.Sprintf("rebuilt-%d", i))
	t, err := Create(dir, h.r.Size(), CreateOptions{BackingFile: h.r.vol.BackingFile})
	h.noErr(err, what+": create the new replica")
	h.noErr(t.BeginImport(ImportOptions{}), what+": begin import")
	ls, err := copyLayers(h.r, t, func() {})
	h.noErr(err, what+": copy layers")
	h.noErr(t.CommitImport(ls, name), what+": commit import")
	for n, s := range h.r.snaps {
		se, err := dataExtents(s.f, h.r.Size())
		h.noErr(err, what+": source extents")
		te, err := dataExtents(t.snaps[n].f, h.r.Size())
		h.noErr(err, what+": copy's extents")
		if len(subtractExtents(te, se)) > 0 {
			h.fatalf("%s: layer %s of the copy holds data at %v, the source's at %v", what, n, te, se)
		}
	}
	h.noErr(h.r.Close(), what+": close the source")
	h.r, h.dir = t, dir
	t.SetLimits(m.maxCount, 0)
}
