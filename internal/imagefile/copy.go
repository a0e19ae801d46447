package imagefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/internal/atomicfile"
)

// CopyFile copies a prepared image to another disk: only its data extents
// are read and written (SEEK_DATA/SEEK_HOLE), so holes stay holes and cost
// no I/O. The copy is written beside dst as ".tmp", fsynced and renamed:
// dst exists only complete. progress is told the bytes of data copied and
// the file's size.
func CopyFile(ctx context.Context, src, dst string, progress Progress) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	out, err := createWork(dst, size)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			out.abandon()
		}
	}()
	var done int64
	buf := make([]byte, 1<<20)
	kernelCopy := true
	err = forEachExtent(in, size, func(start, end int64) error {
		for pos := start; pos < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			var n int
			if kernelCopy {
				// copy_file_range: the kernel moves the bytes (or shares
				// them, on a filesystem that can), no copy through here.
				rpos, wpos := pos, pos
				n, err = unix.CopyFileRange(int(in.Fd()), &rpos, int(out.Fd()), &wpos, int(min(end-pos, 64<<20)), 0)
				if err != nil && (errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EXDEV) ||
					errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
					kernelCopy, err = false, nil
					continue
				}
				if err == nil && n == 0 {
					err = io.ErrUnexpectedEOF
				}
			} else {
				n, err = in.ReadAt(buf[:min(int64(len(buf)), end-pos)], pos)
				if n > 0 {
					if _, werr := out.WriteAt(buf[:n], pos); werr != nil {
						return werr
					}
				}
				if errors.Is(err, io.EOF) && pos+int64(n) >= end {
					err = nil
				}
			}
			pos += int64(n)
			done += int64(n)
			if progress != nil && n > 0 {
				progress(done, size)
			}
			if err != nil {
				return fmt.Errorf("copying %s at %d: %w", src, pos, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return out.commit()
}

// workFile is a file being written beside its final name (dst + ".tmp"):
// commit makes it durable and gives it the final name, abandon removes it,
// so the final name only ever holds a complete file.
type workFile struct {
	*os.File
	tmp, dst string
}

// createWork creates dst's work file, sized (sparse) to size.
func createWork(dst string, size int64) (*workFile, error) {
	tmp := dst + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	w := &workFile{File: f, tmp: tmp, dst: dst}
	if err := f.Truncate(size); err != nil {
		w.abandon()
		return nil, err
	}
	return w, nil
}

func (w *workFile) commit() error {
	if err := w.Sync(); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return atomicfile.Rename(w.tmp, w.dst)
}

func (w *workFile) abandon() {
	w.Close()
	os.Remove(w.tmp)
}

// forEachExtent calls fn with each run of data of f, [start, end), in
// order, up to size.
func forEachExtent(f *os.File, size int64, fn func(start, end int64) error) error {
	for off := int64(0); off < size; {
		start, end, ok, err := nextExtent(f, off, size)
		if err != nil {
			return fmt.Errorf("mapping %s: %w", f.Name(), err)
		}
		if !ok {
			return nil
		}
		if err := fn(start, end); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// nextExtent finds the next run of data at or after off: [start, end).
func nextExtent(f *os.File, off, size int64) (start, end int64, ok bool, err error) {
	start, err = unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return 0, 0, false, nil // only a hole is left
	}
	if err != nil {
		return 0, 0, false, err
	}
	end, err = unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
	if err != nil {
		return 0, 0, false, err
	}
	return start, min(end, size), true, nil
}
