package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Zero marks: how WriteZeroes hides lower data without allocating.
//
// Issue 43: ext4 on a loop device over the FUSE file, 64 MiB written, a
// snapshot kept, then rm + fstrim. The loop driver turns DISCARD and
// WRITE_ZEROES into a punched hole, which must read back as zeros, so the
// FUSE file passes it on as WriteZeroes. WriteZeroes used to write zero
// blocks into the head wherever a snapshot held the block (a hole there
// would reveal the snapshot's data): the trim allocated 64 MiB instead of
// freeing anything. Filling with FALLOC_FL_ZERO_RANGE would not help:
// unwritten extents are allocated just the same.
//
// So a layer may hold a block as zeros without allocating it: a zero mark.
// A layer holds block b iff its file has data at b or its mark for b is
// set; a marked block whose file has a hole reads zeros, so no read path
// changes: the location map (owner, headBits) is built from data ∪ marks,
// and reading the layer's file at a hole gives the zeros. A marked block
// that also has data reads the data ("data wins"): writes never clear
// marks, on disk or in memory, so a mark never has to be undone in step
// with data that may not be durable yet.
//
// On disk a layer's marks are <image>.zero: the bitmap's words in
// little-endian order (word w at byte 8w), sparse; a 4 KiB page of it
// whose marks are all clear is punched, so the file takes 4 KiB per
// 128 MiB of volume where marks are, nothing elsewhere. It belongs to the
// layer: Chain counts its allocated bytes in the layer's Size (it is what
// du counts), a snapshot takes the head's file with it (a hard link, made
// with the image's, before volume.meta commits), Open deletes one
// volume.meta does not reference, and the layer's removal removes it.
//
// Durability, for the head: WriteZeroes writes the words it sets before it
// returns (a killed process loses nothing) and Flush fdatasyncs the file
// with the head (a power cut loses only what was not flushed, as for any
// write). Where the head held data in the range, that data is punched only
// once the marks are durable: a punch that outlived a lost mark would
// reveal the older data of the layer below, even after a Flush. Marks are
// cleared only where nothing may show through: head blocks with nothing
// below that WriteZeroes or Unmap punch, blocks a prune frees from every
// layer, a head an import starts over.
//
// Purge keeps marks as data: coalesce adds the removed parent's marks
// (where the child holds nothing) to the child, and never copies data
// under a child's mark; prune of a removed snapshot s under the head
// treats head marks as blocks the head holds (so s's copy is punched,
// which is what frees a trimmed snapshot's space once it is deleted), and
// clears s's marks the head covers, or that hide nothing because no layer
// below holds the block. Rebuild, export and clone see marks through
// Extents, which reports a layer's data ∪ marks: ReadLayer reads zeros
// there, which hide the older data beneath on the reader's side too. An
// importing replica keeps the zero blocks it receives as marks
// (ImportWrite), so a rebuild allocates no more than the source.

// zeroSuffix ends a zero-marks file's name (isLayerFile knows it).
const zeroSuffix = imgSuffix + ".zero"

func zeroFileName(img string) string { return img + ".zero" }

// markExtents lists l's zero marks below size as byte extents.
func markExtents(l *layer, size int64) []Extent {
	if l.zeros == nil {
		return nil
	}
	n := min(size/bs, int64(len(l.zeros.pages))<<pageShift)
	return bitmapExtents(l.zeros, n)
}

// heldExtents lists what l holds below size: its data (through extents)
// and its zero marks.
func heldExtents(l *layer, size int64, extents extentsFunc) ([]Extent, error) {
	exts, err := extents(l, size)
	if err != nil {
		return nil, err
	}
	if marks := markExtents(l, size); len(marks) > 0 {
		exts = unionExtents(exts, marks)
	}
	return exts, nil
}

// emptyBitmap reports whether m has no bit set.
func emptyBitmap(m *bitmap) bool {
	if m == nil {
		return true
	}
	for i := range m.pages {
		p := m.pages[i].Load()
		if p == nil {
			continue
		}
		for j := range int64(pageWords) {
			if p.word(j) != 0 {
				return false
			}
		}
	}
	return true
}

// loadZeros reads the zero-marks file of layer l, if it has one, and keeps
// it open; Open calls it before building the location map. Unlike the
// discard hints, marks are content: a file that cannot be read fails Open.
func (r *Replica) loadZeros(l *layer) error {
	path := filepath.Join(r.dir, zeroFileName(l.file))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		if l.kind == kindHead {
			l.zeros = newBitmap(r.size / bs)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: zero marks %s: %w", ErrBadMeta, path, err)
	}
	m, err := readBitmapFile(f, r.size/bs)
	if err != nil {
		f.Close()
		return fmt.Errorf("%w: zero marks %s: %w", ErrBadMeta, path, err)
	}
	l.zeros, l.zeroF = m, f
	return nil
}

// readBitmapFile reads a file of little-endian words into a bitmap of
// nblocks blocks; bits past them are ignored.
func readBitmapFile(f *os.File, nblocks int64) (*bitmap, error) {
	m := newBitmap(nblocks)
	exts, err := dataExtents(f, 8*((nblocks+63)>>6))
	if err != nil {
		return nil, err
	}
	for _, ext := range exts {
		buf := make([]byte, ext.Length)
		n, err := f.ReadAt(buf, ext.Offset)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		loadWords(m, ext.Offset/8, buf[:n], nblocks)
	}
	return m, nil
}

// loadWords loads the little-endian words in buf, word first on, into m,
// which no one else sees yet; bits past nblocks are ignored.
func loadWords(m *bitmap, first int64, buf []byte, nblocks int64) {
	for i := 0; i+8 <= len(buf); i += 8 {
		w := first + int64(i/8)
		v := binary.LittleEndian.Uint64(buf[i:])
		if blk := w << 6; v != 0 && blk < nblocks {
			if n := nblocks - blk; n < 64 {
				v &= 1<<uint(n) - 1
			}
			m.pageFor(blk)[w%pageWords] = v
		}
	}
}

// writeBitmapWords stores the marks of m for blocks [b, e) in f, in whole
// pages of the bitmap (4 KiB of words each): a page with a bit set is
// written, one without is punched, so the file is as sparse as the marks.
// A page missing from memory was never set since the file was read, and a
// read skips clear pages, so the file holds nothing there either.
func writeBitmapWords(f *os.File, m *bitmap, b, e int64) error {
	if b >= e {
		return nil
	}
	const pageBytes = pageWords * 8
	var buf []byte
	for pg := b >> pageShift; pg <= (e-1)>>pageShift; pg++ {
		p := m.pages[pg].Load()
		if p == nil {
			continue
		}
		if buf == nil {
			buf = make([]byte, pageBytes)
		}
		var any uint64
		for j := range int64(pageWords) {
			w := p.word(j)
			any |= w
			binary.LittleEndian.PutUint64(buf[8*j:], w)
		}
		off := pg * pageBytes
		if any != 0 {
			if _, err := f.WriteAt(buf, off); err != nil {
				return fmt.Errorf("write at %d: %w", off, err)
			}
			continue
		}
		err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, pageBytes)
		if err != nil {
			return fmt.Errorf("punch at %d: %w", off, err)
		}
	}
	return nil
}

// createZeroFile creates l's zero-marks file, durably (its directory
// entry is synced); the caller sets l.zeroF under the exclusive lock, as
// Chain reads it.
func (r *Replica) createZeroFile(l *layer) (*os.File, error) {
	path := filepath.Join(r.dir, zeroFileName(l.file))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, fileMode)
	if err != nil {
		return nil, fmt.Errorf("zero marks of %s: %w", l.file, err)
	}
	if err := syncDir(r.dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("zero marks of %s: %w", l.file, err)
	}
	return f, nil
}

// persistZeros writes l's marks for blocks [b, e) to its file, which the
// caller made sure exists if l ever had a mark.
func (r *Replica) persistZeros(l *layer, b, e int64) error {
	if l.zeroF == nil {
		return fmt.Errorf("zero marks of %s: no file", l.file)
	}
	if err := writeBitmapWords(l.zeroF, l.zeros, b, e); err != nil {
		return fmt.Errorf("zero marks of %s: %w", l.file, err)
	}
	return nil
}

// persistZeroExtents writes l's marks over exts (byte extents).
func (r *Replica) persistZeroExtents(l *layer, exts []Extent) error {
	for _, e := range exts {
		if err := r.persistZeros(l, e.Offset/bs, e.End()/bs); err != nil {
			return err
		}
	}
	return nil
}

// syncZeros makes l's marks file durable, if it has one.
func (r *Replica) syncZeros(l *layer) error {
	if l.zeroF == nil {
		return nil
	}
	if err := unix.Fdatasync(int(l.zeroF.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Join(r.dir, zeroFileName(l.file)), err)
	}
	return nil
}

// closeZeros closes l's marks file, if open.
func closeZeros(l *layer) {
	if l.zeroF != nil {
		l.zeroF.Close()
		l.zeroF = nil
	}
}

// markHeadZeros makes head blocks [b, e), which a lower layer holds, read
// as zeros: marks, persisted, and no data. The caller holds the exclusive
// lock.
func (r *Replica) markHeadZeros(b, e int64) error {
	h := r.head
	mayHaveData := r.headBits.runEnd(b, e, false) < e
	if h.zeros.runEnd(b, e, true) < e {
		if h.zeroF == nil {
			f, err := r.createZeroFile(h)
			if err != nil {
				return err
			}
			h.zeroF = f
		}
		h.zeros.set(b, e)
		if err := r.persistZeros(h, b, e); err != nil {
			return err
		}
	}
	r.headBits.set(b, e)
	if !mayHaveData {
		return nil
	}
	data, err := dataExtentsIn(h.f, b*bs, e*bs)
	if err != nil {
		return fmt.Errorf("scan %s: %w", h.file, err)
	}
	if len(data) == 0 {
		return nil
	}
	// The data goes only once the marks are durable (see above).
	if err := r.syncZeros(h); err != nil {
		return err
	}
	for _, d := range data {
		err := unix.Fallocate(int(h.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, d.Offset, d.Length)
		if err != nil {
			return fmt.Errorf("punch %s at %d length %d: %w", h.file, d.Offset, d.Length, err)
		}
	}
	crashPoint("zeroes:punched")
	return nil
}

// unmarkHead clears the head's marks over [b, e), blocks it no longer
// holds. The caller holds the exclusive lock.
func (r *Replica) unmarkHead(b, e int64) error {
	h := r.head
	if h.zeros.runEnd(b, e, false) >= e {
		return nil
	}
	h.zeros.clear(b, e)
	return r.persistZeros(h, b, e)
}

// dropHeadZeros forgets every mark of the head and deletes its file: the
// head holds nothing any more (an import starting over). The caller holds
// the exclusive lock.
func (r *Replica) dropHeadZeros() {
	h := r.head
	h.zeros = newBitmap(r.size / bs)
	closeZeros(h)
	r.removeFiles(zeroFileName(h.file))
}

// layerAllocated is what l takes on disk: its image and its marks file.
func (r *Replica) layerAllocated(l *layer) (int64, error) {
	n, err := allocated(l)
	if err != nil || l.zeroF == nil {
		return n, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(l.zeroF.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", zeroFileName(l.file), err)
	}
	return n + st.Blocks*512, nil
}

// growZeros extends every layer's marks to nblocks blocks (Expand); the
// caller holds the exclusive lock.
func (r *Replica) growZeros(nblocks int64) {
	for _, l := range r.slots {
		if l != nil && l.zeros != nil {
			l.zeros = l.zeros.grown(nblocks)
		}
	}
}

// punchExtents punches exts out of l's image, durably.
func punchExtents(l *layer, exts []Extent) error {
	if len(exts) == 0 {
		return nil
	}
	for _, e := range exts {
		err := unix.Fallocate(int(l.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, e.Offset, e.Length)
		if err != nil {
			return fmt.Errorf("punch %s at %d length %d: %w", l.file, e.Offset, e.Length, err)
		}
	}
	if err := unix.Fsync(int(l.f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", l.file, err)
	}
	return nil
}

// addZeroMarks marks exts (byte extents) in snapshot layer l, durably.
// The caller holds opMu; the I/O lock is taken for memory only, since
// Extents reads the marks.
func (r *Replica) addZeroMarks(l *layer, exts []Extent) error {
	if len(exts) == 0 {
		return nil
	}
	var f *os.File
	if l.zeroF == nil { // only a purge, which holds opMu, sets a snapshot's
		var err error
		if f, err = r.createZeroFile(l); err != nil {
			return err
		}
	}
	r.mu.Lock()
	if f != nil {
		l.zeroF = f
	}
	if l.zeros == nil {
		l.zeros = newBitmap(r.size / bs)
	}
	for _, e := range exts {
		l.zeros.set(e.Offset/bs, e.End()/bs)
	}
	r.mu.Unlock()
	if err := r.persistZeroExtents(l, exts); err != nil {
		return err
	}
	return r.syncZeros(l)
}

// writeStagedZeros gives imported layer l, not yet referenced, the zero
// marks m received for it (nil: none) in a marks file of its final name,
// durable once the caller syncs the directory.
func (r *Replica) writeStagedZeros(l *layer, m *bitmap) error {
	if emptyBitmap(m) {
		return nil
	}
	path := filepath.Join(r.dir, zeroFileName(l.file))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, fileMode)
	if err != nil {
		return fmt.Errorf("zero marks of %s: %w", l.file, err)
	}
	l.zeros, l.zeroF = m, f
	if err := writeBitmapWords(f, m, 0, r.size/bs); err != nil {
		return fmt.Errorf("zero marks of %s: %w", l.file, err)
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
