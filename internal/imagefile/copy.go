package imagefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
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
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(tmp)
		}
	}()
	if err := out.Truncate(size); err != nil {
		return err
	}
	var done int64
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; {
		start, end, ok, err := nextExtent(in, off, size)
		if err != nil {
			return fmt.Errorf("mapping %s: %w", src, err)
		}
		if !ok {
			break
		}
		for pos := start; pos < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := in.ReadAt(buf[:min(int64(len(buf)), end-pos)], pos)
			if n > 0 {
				if _, werr := out.WriteAt(buf[:n], pos); werr != nil {
					return werr
				}
				pos += int64(n)
				done += int64(n)
				if progress != nil {
					progress(done, size)
				}
			}
			if err != nil && !(errors.Is(err, io.EOF) && pos >= end) {
				return fmt.Errorf("reading %s at %d: %w", src, pos, err)
			}
		}
		off = end
	}
	if err := out.Sync(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dst))
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
