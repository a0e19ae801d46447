package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// The discard marks on disk: an instance manager restarted between a trim
// and the delete of the snapshot it trimmed must still free that space.
//
// The head's marks are kept in <head>.discard, the bitmap's words in
// little-endian order (word w at byte 8w), a sparse file: a volume that
// never trimmed over a snapshot has none, and one that did stores the
// words it touched. Unmap and WriteZeroes write the words they set (no
// fsync: a mark lost in a power cut only leaves space unfreed); a prune
// writes those it clears. Writes clear marks in memory only, since the
// write path shares its lock and must not touch a second file; so the
// file may name blocks written since. Open therefore keeps a mark only
// where it is still true: a lower layer holds the block, and the head
// either does not hold it (a trim) or holds zeros (a write-zeroes' zero
// mark over a hole, or zeros the user wrote, which a purge may free just
// the same). A block written
// with data fails that check, so a stale mark can never free written data.
// A new head (snapshot, revert, rebuild) starts with no marks and no file.

// discardSuffix ends a discard file's name (isLayerFile knows it).
const discardSuffix = imgSuffix + ".discard"

func discardFileName(head string) string { return strings.TrimSuffix(head, imgSuffix) + discardSuffix }

// persistDiscarded writes the words of the marks covering blocks [b, e) to
// the head's discard file. The caller holds the exclusive lock. The marks
// are a hint: failing to store them costs space, never data, so an error
// drops the file (no stale hint stays behind) instead of failing the trim.
func (r *Replica) persistDiscarded(b, e int64) {
	if b >= e {
		return
	}
	if r.discardF == nil {
		f, err := os.OpenFile(filepath.Join(r.dir, discardFileName(r.head.file)), os.O_RDWR|os.O_CREATE, fileMode)
		if err != nil {
			return
		}
		r.discardF = f
	}
	// In pieces of at most 1 MiB of words (32 GiB of volume): a trim of a
	// whole large volume must not allocate its whole bitmap at once.
	const chunkWords = 1 << 17
	buf := make([]byte, 8*min(chunkWords, (e-1)>>6-b>>6+1))
	for first, last := b>>6, (e-1)>>6; first <= last; first += chunkWords {
		n := min(chunkWords, last-first+1)
		for i := range n {
			w := first + i
			binary.LittleEndian.PutUint64(buf[8*i:], r.discarded.pageOf(w<<6).word(w%pageWords))
		}
		if _, err := r.discardF.WriteAt(buf[:8*n], 8*first); err != nil {
			r.dropDiscardFile()
			return
		}
	}
}

// dropDiscardFile closes and deletes the head's discard file: its marks
// are gone or may not be stored.
func (r *Replica) dropDiscardFile() {
	r.closeDiscardFile()
	r.removeFiles(discardFileName(r.head.file))
}

// closeDiscardFile closes the discard file of the head that was, before a
// new head takes its place, or at Close.
func (r *Replica) closeDiscardFile() {
	if r.discardF != nil {
		r.discardF.Close()
		r.discardF = nil
	}
}

// loadDiscarded reads the head's discard file into r.discarded and keeps
// the marks that are still true (see above); Open calls it once the
// location maps are built. A file it cannot read only costs its marks:
// a hint never keeps a replica from opening.
func (r *Replica) loadDiscarded() {
	nblocks := r.size / bs
	r.discarded = newBitmap(nblocks)
	f, err := os.OpenFile(filepath.Join(r.dir, discardFileName(r.head.file)), os.O_RDWR, 0)
	if err != nil {
		return
	}
	r.discardF = f
	dropped, err := r.readDiscarded(nblocks)
	if err != nil {
		r.discarded = newBitmap(nblocks)
		r.dropDiscardFile()
		return
	}
	for _, d := range dropped {
		r.persistDiscarded(d.Offset/bs, d.End()/bs)
	}
}

// readDiscarded loads the marks of the discard file and drops those no
// longer true, which it returns.
func (r *Replica) readDiscarded(nblocks int64) ([]Extent, error) {
	exts, err := dataExtents(r.discardF, 8*((nblocks+63)>>6))
	if err != nil {
		return nil, err
	}
	for _, ext := range exts {
		buf := make([]byte, ext.Length)
		if _, err := r.discardF.ReadAt(buf, ext.Offset); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		r.setWords(ext.Offset/8, buf, nblocks)
	}
	return r.dropStaleMarks(nblocks)
}

// setWords loads the little-endian words in buf, word first on, into the
// fresh map (no one else sees it yet); bits past the volume are ignored.
func (r *Replica) setWords(first int64, buf []byte, nblocks int64) {
	for i := 0; i+8 <= len(buf); i += 8 {
		w := first + int64(i/8)
		v := binary.LittleEndian.Uint64(buf[i:])
		if blk := w << 6; v != 0 && blk < nblocks {
			if n := nblocks - blk; n < 64 {
				v &= 1<<uint(n) - 1
			}
			r.discarded.pageFor(blk)[w%pageWords] = v
		}
	}
}

// maxMarkCheck bounds what Open reads to check marks over head data, so
// a replica with much trimmed-over data still opens in seconds; marks past
// it are dropped, which only leaves their space unfreed. Head blocks held
// by a zero mark over a hole read zeros without being read.
const maxMarkCheck = 1 << 30

// dropStaleMarks clears the marks that are no longer true and returns
// them as extents, in order.
func (r *Replica) dropStaleMarks(nblocks int64) ([]Extent, error) {
	var dropped []Extent
	drop := func(b, e int64) {
		r.discarded.clear(b, e)
		if n := len(dropped); n > 0 && dropped[n-1].End() == b*bs {
			dropped[n-1].Length += (e - b) * bs
			return
		}
		dropped = append(dropped, Extent{Offset: b * bs, Length: (e - b) * bs})
	}
	buf := make([]byte, 256*bs)
	budget := int64(maxMarkCheck)
	for b := int64(0); b < nblocks; {
		if b = r.discarded.runEnd(b, nblocks, false); b >= nblocks {
			break
		}
		e := r.discarded.runEnd(b, nblocks, true)
		if lower := r.owner.get(b) != 0; !lower {
			e = r.owner.lowerRunEnd(b, e, false)
			drop(b, e) // nothing below: a mark has nothing to free
			b = e
			continue
		}
		e = r.owner.lowerRunEnd(b, e, true)
		if !r.headHas(b) {
			b = r.headBits.runEnd(b, e, false)
			continue
		}
		e = r.headBits.runEnd(b, e, true)
		data, err := dataExtentsIn(r.head.f, b*bs, e*bs)
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", r.head.file, err)
		}
		for _, d := range data {
			for x, stop := d.Offset/bs, d.End()/bs; x < stop; {
				y := min(stop, x+int64(len(buf))/bs)
				if budget <= 0 {
					drop(x, y)
					x = y
					continue
				}
				n := (y - x) * bs
				budget -= n
				if _, err := r.head.f.ReadAt(buf[:n], x*bs); err != nil {
					return nil, fmt.Errorf("read %s at %d: %w", r.head.file, x*bs, err)
				}
				for i := int64(0); i < y-x; i++ {
					if !bytes.Equal(buf[i*bs:(i+1)*bs], zeroBuf[:bs]) {
						drop(x+i, x+i+1)
					}
				}
				x = y
			}
		}
		b = e
	}
	return dropped, nil
}
