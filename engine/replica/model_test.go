package replica

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strata-storage/strata/engine/blockdev"
)

// The model test runs random operation sequences against a replica and an
// in-memory model of the device and of the snapshot tree (write, read,
// write-zeroes, unmap, snapshot, remove, purge, revert, expand, reopen,
// rebuild onto a new replica, reads the way export does; see also
// model_zero_test.go for what write-zeroes and unmap may allocate): TestModel runs
// the first 200 (make test), TestLongModel the first 2,000 (make
// test-long). Another count with -replica.seqs=N -replica.ops=M (or
// STRATA_REPLICA_SEQS/OPS, for both); replay one with -replica.seed=S.
var (
	flagSeqs = flag.Int("replica.seqs", envInt("STRATA_REPLICA_SEQS", 0), "model test: number of sequences (0: the test's own)")
	flagOps  = flag.Int("replica.ops", envInt("STRATA_REPLICA_OPS", 40), "model test: operations per sequence")
	flagSeed = flag.Int64("replica.seed", 0, "model test: run only this seed")
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

type modelSnap struct {
	parent  string
	removed bool
	user    bool
	created time.Time
	labels  map[string]string
	dev     *blockdev.Mem // content when taken
	known   []bool
}

// model is the expected state: the device content and the snapshot tree.
// Bytes Unmap made unspecified are not known; dev keeps their value from
// before the Unmap, the only non-zero value they may read as.
type model struct {
	dev        *blockdev.Mem
	known      []bool
	snaps      map[string]*modelSnap
	headParent string
	maxCount   int
}

func copyMem(m *blockdev.Mem) *blockdev.Mem {
	c := blockdev.NewMem(m.Size())
	buf := make([]byte, m.Size())
	m.ReadAt(buf, 0)
	c.WriteAt(buf, 0)
	return c
}

func (m *model) userCount() int {
	n := 0
	for _, s := range m.snaps {
		if s.user && !s.removed {
			n++
		}
	}
	return n
}

func (m *model) children(name string) (kids []string, head bool) {
	for n, s := range m.snaps {
		if s.parent == name {
			kids = append(kids, n)
		}
	}
	slices.Sort(kids)
	return kids, m.headParent == name
}

// adoptDroppedUnderHead follows what a purge did under the head. The
// model collapses removed snapshots under the head into one in name order;
// the replica goes in creation order and drops a layer the prune left
// empty, which the model cannot know. So where the head's parent is a
// removed snapshot with no other child, the model takes the replica's
// word: no layer there (dropped), or another removed layer of that run in
// the same place (as it was before the purge, its meta kept). The content
// checks that follow catch a layer dropped or merged wrongly.
func (h *harness) adoptDroppedUnderHead(before map[string]*modelSnap) {
	info, err := h.r.Chain()
	h.noErr(err, "chain")
	layers := map[string]LayerInfo{}
	for _, l := range info.Layers {
		layers[l.Name] = l
	}
	m := h.m
	s := m.snaps[m.headParent]
	if kids, _ := m.children(m.headParent); s == nil || !s.removed || len(kids) != 0 {
		return
	}
	got := layers[HeadName].Parent
	switch l, ok := layers[got]; {
	case got == m.headParent:
	case got == s.parent:
		delete(m.snaps, m.headParent)
		m.headParent = got
	case ok && l.Removed && l.Parent == s.parent && m.snaps[got] == nil && before[got] != nil:
		delete(m.snaps, m.headParent)
		kept := *before[got]
		kept.parent = s.parent
		m.snaps[got] = &kept
		m.headParent = got
	}
}

// purge applies the documented rules until nothing changes.
func (m *model) purge() {
	for changed := true; changed; {
		changed = false
		for _, name := range slices.Sorted(maps.Keys(m.snaps)) {
			s := m.snaps[name]
			if s == nil || !s.removed {
				continue
			}
			kids, head := m.children(name)
			switch {
			case len(kids) == 0 && !head:
				delete(m.snaps, name)
				changed = true
			case len(kids) == 1 && !head:
				m.snaps[kids[0]].parent = s.parent
				delete(m.snaps, name)
				changed = true
			}
		}
	}
}

type harness struct {
	t       *testing.T
	seed    int64
	rng     *rand.Rand
	dir     string
	r       *Replica
	m       *model
	history []string
	nextID  int
}

func (h *harness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("seed %d (replay: go test -run 'TestModel' -replica.seed=%d ./engine/replica/): %s\nlast operations:\n  %s",
		h.seed, h.seed, fmt.Sprintf(format, args...), strings.Join(h.history[max(0, len(h.history)-25):], "\n  "))
}

func (h *harness) noErr(err error, what string) {
	h.t.Helper()
	if err != nil {
		h.fatalf("%s: unexpected error: %v", what, err)
	}
}

func (h *harness) wantErr(err, want error, what string) {
	h.t.Helper()
	if want == nil {
		h.noErr(err, what)
		return
	}
	if !errors.Is(err, want) {
		h.fatalf("%s: got error %v, want %v", what, err, want)
	}
}

func (h *harness) log(format string, args ...any) {
	h.history = append(h.history, fmt.Sprintf(format, args...))
}

// randRange picks an I/O range, often unaligned, often crossing blocks.
func (h *harness) randRange() (int64, int64) {
	size := h.m.dev.Size()
	var length int64
	switch h.rng.IntN(3) {
	case 0:
		length = 1 + h.rng.Int64N(2*bs)
	case 1:
		length = (1 + h.rng.Int64N(8)) * bs
	default:
		length = 1 + h.rng.Int64N(5*bs)
	}
	length = min(length, size)
	var off int64
	switch h.rng.IntN(4) {
	case 0:
		off = h.rng.Int64N(size/bs) * bs
	case 1:
		off = h.rng.Int64N(size/bs)*bs + []int64{1, bs - 1, bs / 2}[h.rng.IntN(3)]
	default:
		off = h.rng.Int64N(size)
	}
	if off+length > size {
		off = size - length
	}
	if length >= bs && h.rng.IntN(2) == 0 {
		off = off / bs * bs
	}
	return off, length
}

func (h *harness) compare(off, length int64, what string) {
	h.t.Helper()
	got := make([]byte, length)
	if _, err := h.r.ReadAt(got, off); err != nil {
		h.fatalf("%s: read %d+%d: %v", what, off, length, err)
	}
	want := make([]byte, length)
	h.m.dev.ReadAt(want, off)
	for i := range got {
		// A byte Unmap made unspecified may read as before or as zero, but
		// never as older data of a lower layer.
		if got[i] != want[i] && (h.m.known[off+int64(i)] || got[i] != 0) {
			h.fatalf("%s: byte %d (block %d, known %v): got %#x, want %#x",
				what, off+int64(i), (off+int64(i))/bs, h.m.known[off+int64(i)], got[i], want[i])
		}
	}
}

func (h *harness) compareAll(what string) {
	h.t.Helper()
	h.compare(0, h.m.dev.Size(), what)
}

func (h *harness) checkChain(what string) {
	h.t.Helper()
	info, err := h.r.Chain()
	h.noErr(err, what+": chain")
	if info.Size != h.m.dev.Size() {
		h.fatalf("%s: chain size %d, want %d", what, info.Size, h.m.dev.Size())
	}
	if len(info.Layers) != len(h.m.snaps)+1 {
		h.fatalf("%s: chain has %d layers, model %d snapshots + head", what, len(info.Layers), len(h.m.snaps))
	}
	for _, l := range info.Layers {
		if l.Size < 0 {
			h.fatalf("%s: layer %s size %d", what, l.Name, l.Size)
		}
		if l.Name == HeadName {
			if l.Parent != h.m.headParent {
				h.fatalf("%s: head parent %q, want %q", what, l.Parent, h.m.headParent)
			}
			continue
		}
		s := h.m.snaps[l.Name]
		if s == nil {
			h.fatalf("%s: chain has snapshot %q the model does not", what, l.Name)
		}
		kids, head := h.m.children(l.Name)
		if head {
			kids = append(kids, HeadName)
		}
		gotKids := slices.Clone(l.Children)
		slices.Sort(gotKids)
		slices.Sort(kids)
		if l.Parent != s.parent || l.Removed != s.removed || l.UserCreated != s.user ||
			!slices.Equal(gotKids, kids) || !maps.Equal(l.Labels, s.labels) ||
			(!s.created.IsZero() && !l.Created.Equal(s.created)) {
			h.fatalf("%s: snapshot %q: got parent %q removed %v user %v children %v labels %v created %v; "+
				"want parent %q removed %v user %v children %v labels %v created %v", what, l.Name,
				l.Parent, l.Removed, l.UserCreated, gotKids, l.Labels, l.Created,
				s.parent, s.removed, s.user, kids, s.labels, s.created)
		}
	}
}

func (h *harness) snapNames(filter func(*modelSnap) bool) []string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(h.m.snaps)) {
		if filter(h.m.snaps[n]) {
			out = append(out, n)
		}
	}
	return out
}

func (h *harness) revertModel(name string) {
	s := h.m.snaps[name]
	size := h.m.dev.Size()
	h.m.dev = copyMem(s.dev)
	h.m.dev.Resize(size)
	h.m.known = append(slices.Clone(s.known), trueSlice(size-int64(len(s.known)))...)
	h.m.headParent = name
}

func trueSlice(n int64) []bool {
	s := make([]bool, n)
	for i := range s {
		s[i] = true
	}
	return s
}

// verifySnapshots reverts to every snapshot not removed and compares.
func (h *harness) verifySnapshots(what string) {
	h.t.Helper()
	for _, n := range h.snapNames(func(s *modelSnap) bool { return !s.removed }) {
		h.log("revert %s (verify)", n)
		h.noErr(h.r.Revert(n), what+": revert "+n)
		h.revertModel(n)
		h.compareAll(what + ": content of " + n)
	}
}

func (h *harness) step(i int) {
	h.t.Helper()
	m := h.m
	what := fmt.Sprintf("op %d", i)
	weights := []struct {
		w  int
		fn func()
	}{
		{30, func() { // write
			off, length := h.randRange()
			p := make([]byte, length)
			for j := range p {
				p[j] = byte(h.rng.IntN(255) + 1) // never 0, so a stray zero shows
			}
			h.log("write %d+%d", off, length)
			n, err := h.r.WriteAt(p, off)
			h.noErr(err, what+": write")
			if n != len(p) {
				h.fatalf("%s: write returned %d", what, n)
			}
			m.dev.WriteAt(p, off)
			copy(m.known[off:], trueSlice(length))
		}},
		{10, func() { // read
			off, length := h.randRange()
			h.log("read %d+%d", off, length)
			h.compare(off, length, what+": read")
		}},
		{7, func() {
			off, length := h.randRange()
			h.log("writeZeroes %d+%d", off, length)
			h.noErr(h.r.WriteZeroes(off, length), what+": writeZeroes")
			m.dev.WriteZeroes(off, length)
			copy(m.known[off:], trueSlice(length))
			h.checkZeroesAllocateNothing(off, length, what)
		}},
		{6, func() {
			off, length := h.randRange()
			h.log("unmap %d+%d", off, length)
			before := h.headData(what)
			h.noErr(h.r.Unmap(off, length), what+": unmap")
			clear(m.known[off : off+length])
			if after := h.headData(what); after > before {
				h.fatalf("%s: unmap grew the head's data from %d to %d bytes", what, before, after)
			}
		}},
		{3, func() {
			h.log("read as export does")
			h.verifyLayerReads(what)
		}},
		{2, func() {
			h.rebuild(what, i)
		}},
		{12, func() { // snapshot
			user := h.rng.IntN(2) == 0
			name := fmt.Sprintf("s%d", h.nextID)
			var want error
			switch k := h.rng.IntN(10); {
			case k == 0:
				name = []string{"", "volume-head", "-x", "a/b", strings.Repeat("x", 64), "ü"}[h.rng.IntN(6)]
				want = ErrInvalidName
			case k == 1 && len(m.snaps) > 0:
				names := slices.Sorted(maps.Keys(m.snaps))
				name = names[h.rng.IntN(len(names))]
				want = ErrSnapshotExists
			default:
				h.nextID++
				if user && m.maxCount > 0 && m.userCount() >= m.maxCount {
					want = ErrSnapshotLimitExceeded
				}
			}
			var created time.Time
			if h.rng.IntN(4) != 0 {
				created = time.Unix(1_700_000_000+int64(h.rng.IntN(1000)), int64(h.rng.IntN(1e9))).UTC()
			}
			var labels map[string]string
			if h.rng.IntN(2) == 0 {
				labels = map[string]string{"k": strconv.Itoa(i)}
			}
			h.log("snapshot %q user=%v (want %v)", name, user, want)
			err := h.r.Snapshot(name, SnapshotOptions{UserCreated: user, Created: created, Labels: labels})
			h.wantErr(err, want, what+": snapshot "+name)
			if want == nil {
				m.snaps[name] = &modelSnap{parent: m.headParent, user: user, created: created, labels: labels,
					dev: copyMem(m.dev), known: slices.Clone(m.known)}
				m.headParent = name
			}
		}},
		{8, func() { // remove
			name, want := "nosuch", error(ErrSnapshotNotFound)
			if names := h.snapNames(func(*modelSnap) bool { return true }); len(names) > 0 && h.rng.IntN(10) != 0 {
				name, want = names[h.rng.IntN(len(names))], nil
			}
			h.log("remove %s", name)
			h.wantErr(h.r.RemoveSnapshot(name), want, what+": remove "+name)
			if want == nil {
				m.snaps[name].removed = true
			}
		}},
		{7, func() { // purge
			h.log("purge")
			var pcts []int
			h.noErr(h.r.Purge(context.Background(), func(p int) { pcts = append(pcts, p) }), what+": purge")
			if len(pcts) == 0 || pcts[0] != 0 || pcts[len(pcts)-1] != 100 || !slices.IsSorted(pcts) {
				h.fatalf("%s: purge progress %v", what, pcts)
			}
			before := maps.Clone(m.snaps)
			m.purge()
			h.adoptDroppedUnderHead(before)
			h.checkChain(what + ": after purge")
			h.compareAll(what + ": after purge")
			if h.rng.IntN(2) == 0 {
				h.verifySnapshots(what + ": after purge")
			}
		}},
		{6, func() { // revert
			names := h.snapNames(func(*modelSnap) bool { return true })
			if len(names) == 0 {
				return
			}
			name := names[h.rng.IntN(len(names))]
			var want error
			if m.snaps[name].removed {
				want = ErrSnapshotRemoved
			}
			h.log("revert %s (want %v)", name, want)
			h.wantErr(h.r.Revert(name), want, what+": revert "+name)
			if want == nil {
				h.revertModel(name)
			}
		}},
		{3, func() { // expand
			newSize := m.dev.Size() + h.rng.Int64N(16)*bs
			h.log("expand %d", newSize)
			h.noErr(h.r.Expand(newSize), what+": expand")
			m.known = append(m.known, trueSlice(newSize-m.dev.Size())...)
			m.dev.Resize(newSize)
		}},
		{5, func() { // close + reopen
			h.log("reopen")
			h.noErr(h.r.Close(), what+": close")
			r, err := Open(h.dir)
			h.noErr(err, what+": open")
			h.r = r
			r.SetLimits(m.maxCount, 0)
		}},
		{2, func() {
			h.log("verify snapshots")
			h.verifySnapshots(what)
		}},
		{3, func() {
			h.log("flush")
			h.noErr(h.r.Flush(), what+": flush")
		}},
	}
	total := 0
	for _, w := range weights {
		total += w.w
	}
	k := h.rng.IntN(total)
	for _, w := range weights {
		if k < w.w {
			w.fn()
			break
		}
		k -= w.w
	}
	h.compareAll(what)
	h.checkChain(what)
}

func runModel(t *testing.T, seed int64, ops int) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	tmp := t.TempDir()
	size := (8 + rng.Int64N(41)) * bs
	m := &model{dev: blockdev.NewMem(size), known: trueSlice(size), snaps: map[string]*modelSnap{}}
	var opts CreateOptions
	if rng.IntN(3) == 0 {
		// A backing file, usually not a whole number of blocks long.
		data := make([]byte, 1+rng.Int64N(size))
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		opts.BackingFile = filepath.Join(tmp, "backing.raw")
		if err := os.WriteFile(opts.BackingFile, data, 0o644); err != nil {
			t.Fatal(err)
		}
		m.dev.WriteAt(data, 0)
	}
	if rng.IntN(3) == 0 {
		m.maxCount = 2 + rng.IntN(4)
	}
	dir := filepath.Join(tmp, "replica")
	r, err := Create(dir, size, opts)
	if err != nil {
		t.Fatalf("seed %d: create: %v", seed, err)
	}
	r.SetLimits(m.maxCount, 0)
	h := &harness{t: t, seed: seed, rng: rng, dir: dir, r: r, m: m}
	defer func() { h.r.Close() }()
	h.compareAll("initial")
	for i := range ops {
		h.step(i)
	}
	// Every surviving snapshot still has its content after a final purge.
	h.log("final purge")
	h.noErr(h.r.Purge(context.Background(), nil), "final purge")
	before := maps.Clone(m.snaps)
	m.purge()
	h.adoptDroppedUnderHead(before)
	h.checkChain("final purge")
	h.verifySnapshots("final")
}

func TestModel(t *testing.T) { runModels(t, 200) }

// TestLongModel is the model test's long mode (make test-long).
func TestLongModel(t *testing.T) { runModels(t, 2000) }

func runModels(t *testing.T, seqs int) {
	if *flagSeed != 0 {
		runModel(t, *flagSeed, *flagOps)
		return
	}
	if *flagSeqs > 0 {
		seqs = *flagSeqs
	}
	for i := range seqs {
		seed := int64(i + 1)
		t.Run(strconv.FormatInt(seed, 10), func(t *testing.T) {
			t.Parallel()
			runModel(t, seed, *flagOps)
		})
	}
}
