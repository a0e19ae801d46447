package backupstore

import (
	"errors"
	"io"
)

// segmentReader reads a list of byte slices as one stream, and seeks in it
// so a client can rewind the body to retry a request (minio-go does). By
// hand because io.MultiReader does not seek and net.Buffers neither seeks
// nor rereads.
type segmentReader struct {
	segs [][]byte
	size int64
	off  int64 // position in the stream
	seg  int   // segment holding off
	in   int   // offset of off inside segs[seg]
}

func newSegmentReader(segs [][]byte) *segmentReader {
	r := &segmentReader{segs: segs}
	for _, s := range segs {
		r.size += int64(len(s))
	}
	return r
}

func (r *segmentReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && r.seg < len(r.segs) {
		c := copy(p[n:], r.segs[r.seg][r.in:])
		n += c
		r.in += c
		if r.in == len(r.segs[r.seg]) {
			r.seg, r.in = r.seg+1, 0
		}
	}
	r.off += int64(n)
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

func (r *segmentReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.size
	case io.SeekStart:
	default:
		return 0, errors.New("segmentReader.Seek: invalid whence")
	}
	if offset < 0 {
		return 0, errors.New("segmentReader.Seek: negative position")
	}
	r.off, r.seg, r.in = offset, 0, 0
	for left := offset; r.seg < len(r.segs); r.seg++ {
		if left < int64(len(r.segs[r.seg])) {
			r.in = int(left)
			break
		}
		left -= int64(len(r.segs[r.seg]))
	}
	return offset, nil
}
