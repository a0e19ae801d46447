package imagefile

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/klauspost/compress/gzip"
	"github.com/ulikunitz/xz"

	"github.com/strata-storage/strata/internal/atomicfile"
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
// the raw data must equal it. Work files sit beside final with a ".tmp"
// suffix and go whatever happens; final appears, fsynced, only when every
// check passed. src is left alone (it is the resumable download).
func Prepare(ctx context.Context, src, final, want string) (Result, error) {
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
		switch format {
		case FormatGzip, FormatXZ:
			err = decompress(cur, next, format)
		case FormatQCOW2:
			err = convertQCOW2(ctx, cur, next)
		case FormatRaw:
			if cur == src {
				err = copySparse(cur, next)
			} else {
				next = cur
			}
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", format, err)
		}
		cur = next
		if format == FormatRaw {
			return finish(cur, final, want, res)
		}
	}
	return res, notAnImage("the image is nested more than 4 formats deep (%v)", res.Formats)
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
	if err := copySparse(src, work); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return finish(work, final, want, res)
}

// finish checks the raw file at cur and renames it into final.
func finish(cur, final, want string, res Result) (Result, error) {
	sum, size, err := Checksum(cur)
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

// Checksum is the SHA-512 of a file's bytes (holes read as zeros) and its size.
func Checksum(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha512.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// decompress streams a gzip or xz file into a sparse file.
func decompress(src, dst string, format Format) error {
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
	return writeSparseFile(dst, r)
}

// copySparse copies a raw file into a sparse one (the source, a download,
// holds every zero it was sent).
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return writeSparseFile(dst, in)
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

// convertQCOW2 writes a qcow2 image as sparse raw (qemu-img; Debian
// qemu-utils). qemu-img, not a Go reader: it knows every qcow2 feature
// (compression, extended L2). An image naming a backing file is refused:
// qemu-img would read that path on this node.
func convertQCOW2(ctx context.Context, src, dst string) error {
	info, err := exec.CommandContext(ctx, "qemu-img", "info", "-f", "qcow2", "--output=json", src).Output()
	if err != nil {
		return fmt.Errorf("qemu-img info: %w", err)
	}
	var meta struct {
		BackingFilename string `json:"backing-filename"`
	}
	if err := json.Unmarshal(info, &meta); err != nil {
		return fmt.Errorf("qemu-img info: %w", err)
	}
	if meta.BackingFilename != "" {
		return notAnImage("the qcow2 image has a backing file (%s); only self-contained images are taken", meta.BackingFilename)
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", "-S", "4k", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img convert: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}
