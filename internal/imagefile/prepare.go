package imagefile

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/gzip"
	"github.com/ulikunitz/xz"

	"github.com/strata-storage/strata/internal/atomicfile"
	"github.com/strata-storage/strata/types"
)

// Result describes a prepared image file.
type Result struct {
	// VirtualSize is the raw image's size: the block device it holds.
	VirtualSize int64
	// Checksum is the SHA-512 of the raw data, in hex.
	Checksum string
	// Formats is what the source was, outermost first (["xz", "qcow2"]).
	Formats []Format
	// SourceSize is the size of the file prepared (a download, an upload).
	SourceSize int64
}

// sectorSize: every disk image is a whole number of sectors.
const sectorSize = 512

// blockSize is the granule of sparseness: an all-zero block is a hole.
const blockSize = 4096

// Prepare turns src (a fetched or uploaded source) into the sparse raw
// image final: gzip and xz are decompressed as a stream, qcow2 is converted
// with qemu-img, raw is taken as it is. When want is set, the SHA-512 of
// the raw data must equal it. src comes from outside, so limits cap what
// each step may write (a decompression stops at its cap) and every step
// stops when ctx ends. Work files sit beside final with a ".tmp" suffix and
// go whatever happens; final appears, fsynced, only when every check
// passed. src is left alone (it is the resumable download).
func Prepare(ctx context.Context, src, final, want string, limits Limits) (Result, error) {
	var res Result
	if st, err := os.Stat(src); err == nil {
		res.SourceSize = st.Size()
	}
	work := final + ".tmp"
	cur := src
	defer os.Remove(work + ".stage")
	defer os.Remove(work)
	for range 4 { // at most xz(gzip(qcow2)) and so on; a deeper nest is not an image
		format, err := detectFile(cur)
		if err != nil {
			return res, err
		}
		res.Formats = append(res.Formats, format)
		next := work + ".stage"
		if cur == next {
			next = work
		}
		if next, err = prepareStage(ctx, format, src, cur, next, limits); err != nil {
			return res, fmt.Errorf("%s: %w", format, err)
		}
		cur = next
		if format == FormatRaw {
			return finish(ctx, cur, final, want, res)
		}
	}
	return res, notAnImage("the image is nested more than 4 formats deep (%v)", res.Formats)
}

// prepareStage turns cur, in format, into the next stage's file and
// returns its path (cur itself for a raw work file: nothing to do).
func prepareStage(ctx context.Context, format Format, src, cur, next string, limits Limits) (string, error) {
	switch format {
	case FormatGzip, FormatXZ:
		return next, decompress(ctx, cur, next, format, limits)
	case FormatQCOW2:
		return next, convertQCOW2(ctx, cur, next, limits)
	}
	st, err := os.Stat(cur)
	if err != nil {
		return "", err
	}
	if err := checkVirtualSize("the raw image", uint64(st.Size()), limits); err != nil {
		return "", err
	}
	if cur != src {
		return cur, nil
	}
	return next, copySparse(ctx, cur, next)
}

// PrepareRaw is Prepare for a source known to be a raw disk (a volume's
// exported bytes), which is never sniffed: a disk may well begin with bytes
// that look like a qcow2 or gzip header.
func PrepareRaw(ctx context.Context, src, final, want string) (Result, error) {
	res := Result{Formats: []Format{FormatRaw}}
	if st, err := os.Stat(src); err == nil {
		res.SourceSize = st.Size()
	}
	work := final + ".tmp"
	defer os.Remove(work)
	// No size cap: the source is a volume, whose size was admitted when
	// it was created, not bytes from outside.
	if err := copySparse(ctx, src, work); err != nil {
		return res, err
	}
	return finish(ctx, work, final, want, res)
}

// finish checks the raw file at cur and renames it into final.
func finish(ctx context.Context, cur, final, want string, res Result) (Result, error) {
	sum, size, err := Checksum(ctx, cur)
	if err != nil {
		return res, err
	}
	res.Checksum, res.VirtualSize = sum, size
	if size%sectorSize != 0 {
		return res, notAnImage("the raw image has %d bytes, not a whole number of %d-byte sectors: not a disk image", size, sectorSize)
	}
	if want != "" && want != sum {
		return res, fmt.Errorf("%w: spec.checksum is %s, the image's raw data has SHA-512 %s", ErrChecksumMismatch, want, sum)
	}
	if err := syncFile(cur); err != nil {
		return res, err
	}
	return res, atomicfile.Rename(cur, final)
}

// Checksum is the SHA-512 of a file's bytes (holes read as zeros) and its
// size. It stops when ctx ends: reading a terabyte of holes takes a while.
func Checksum(ctx context.Context, path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha512.New()
	n, err := io.CopyBuffer(h, ctxReader{ctx, f}, make([]byte, 1<<20))
	if err != nil {
		return "", 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// decompress streams a gzip or xz file into a sparse file of at most the
// decompression cap: a bomb stops there, having written no more.
func decompress(ctx context.Context, src, dst string, format Format, limits Limits) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	var r io.Reader
	switch format {
	case FormatGzip:
		zr, err := gzip.NewReader(in)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	case FormatXZ:
		if r, err = xz.NewReader(in); err != nil {
			return err
		}
	}
	limit := limits.maxDecompressed()
	capped := &cappedReader{r: ctxReader{ctx, r}, max: limit, tooLarge: func() error {
		return limitExceeded(LimitVirtualSize, limits.maxVirtualSize(),
			"the %s stream decompresses to more than %d bytes (the virtual size cap of %s and room for a qcow2's tables); stopped there",
			format, limit, types.ApproxBytes(limits.maxVirtualSize()))
	}}
	return writeSparseFile(dst, capped)
}

// copySparse copies a raw file into a sparse one (the source, a download,
// holds every zero it was sent).
func copySparse(ctx context.Context, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return writeSparseFile(dst, ctxReader{ctx, in})
}

// writeSparseFile writes r to path, leaving holes for all-zero blocks.
func writeSparseFile(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	n, err := writeSparse(f, r)
	if err == nil {
		err = f.Truncate(n) // a trailing hole still counts
	}
	return errors.Join(err, f.Close())
}

var zeros [blockSize]byte

func writeSparse(f *os.File, r io.Reader) (int64, error) {
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, err := io.ReadFull(r, buf)
		for i := 0; i < n; i += blockSize {
			blk := buf[i:min(i+blockSize, n)]
			if !bytes.Equal(blk, zeros[:len(blk)]) {
				if _, werr := f.WriteAt(blk, off+int64(i)); werr != nil {
					return 0, werr
				}
			}
		}
		off += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return off, nil
		}
		if err != nil {
			return 0, err
		}
	}
}
