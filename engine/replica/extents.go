package replica

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/engine/blockdev"
)

// Extent is a byte range [Offset, Offset+Length).
type Extent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// End is the first byte after the extent.
func (e Extent) End() int64 { return e.Offset + e.Length }

// dataExtents lists the data ranges of f below limit with SEEK_DATA and
// SEEK_HOLE, widened to whole blocks: layers are written in whole blocks,
// and a partly-used last block of a backing file still belongs to it.
func dataExtents(f *os.File, limit int64) ([]Extent, error) { return dataExtentsIn(f, 0, limit) }

// dataExtentsIn is dataExtents of [from, limit); from is block-aligned.
func dataExtentsIn(f *os.File, from, limit int64) ([]Extent, error) {
	fd := int(f.Fd())
	var out []Extent
	for off := from; off < limit; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data after off
		}
		if err != nil {
			return nil, fmt.Errorf("SEEK_DATA at %d: %w", off, err)
		}
		if start >= limit {
			break
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("SEEK_HOLE at %d: %w", start, err)
		}
		off = end
		start = start / bs * bs
		end = min((end+bs-1)/bs*bs, limit)
		if n := len(out); n > 0 && out[n-1].End() >= start {
			out[n-1].Length = max(out[n-1].End(), end) - out[n-1].Offset
			continue
		}
		out = append(out, Extent{Offset: start, Length: end - start})
	}
	return out, nil
}

func extentBytes(exts []Extent) int64 {
	var n int64
	for _, e := range exts {
		n += e.Length
	}
	return n
}

// subtractExtents returns the parts of a not covered by b; both are sorted
// and non-overlapping.
func subtractExtents(a, b []Extent) []Extent {
	var out []Extent
	j := 0
	for _, e := range a {
		start, end := e.Offset, e.End()
		for j < len(b) && b[j].End() <= start {
			j++
		}
		for k := j; k < len(b) && b[k].Offset < end; k++ {
			if b[k].Offset > start {
				out = append(out, Extent{Offset: start, Length: b[k].Offset - start})
			}
			start = max(start, b[k].End())
		}
		if start < end {
			out = append(out, Extent{Offset: start, Length: end - start})
		}
	}
	return out
}

// readFull reads len(p) bytes at off; bytes past the end of the file read
// as zeros (a backing file may be shorter than the volume, a snapshot
// shorter than an expanded volume).
func readFull(f *os.File, p []byte, off int64) error {
	n, err := f.ReadAt(p, off)
	if err == io.EOF {
		clear(p[n:])
		return nil
	}
	return err
}

// layerByName finds a layer for Extents and ReadLayer.
func (r *Replica) layerByName(name string) (*layer, error) {
	switch {
	case name == HeadName:
		return r.head, nil
	case name == BackingName && r.backing != nil:
		return r.backing, nil
	}
	if s := r.snaps[name]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrSnapshotNotFound, name)
}

// Extents lists the extents one layer (a snapshot name, HeadName or
// BackingName) holds, block-aligned and within the volume, for rebuild,
// export and clone: its data and its zero marks (zeromarks.go), where
// ReadLayer reads zeros that hide what layers below hold. For the head it
// is a point-in-time view while writes continue. A backing file's partly
// used last block counts whole.
func (r *Replica) Extents(name string) ([]Extent, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return nil, ErrClosed
	}
	l, err := r.layerByName(name)
	if err != nil {
		return nil, err
	}
	exts, err := heldExtents(l, r.size, scanExtents)
	if err != nil {
		return nil, fmt.Errorf("extents of %s: %w", l.file, err)
	}
	return exts, nil
}

// ReadLayer reads one layer's own content, holes as zeros, ignoring the
// rest of the chain. Past the end of a backing file shorter than the
// volume it reads zeros, as the volume does.
func (r *Replica) ReadLayer(name string, p []byte, off int64) (int, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return 0, ErrClosed
	}
	if err := blockdev.CheckRange(off, int64(len(p)), r.size); err != nil {
		return 0, err
	}
	l, err := r.layerByName(name)
	if err != nil {
		return 0, err
	}
	if err := readFull(l.f, p, off); err != nil {
		return 0, fmt.Errorf("read %s at %d: %w", l.file, off, err)
	}
	return len(p), nil
}
