package blockdev

import (
	"os"

	"golang.org/x/sys/unix"
)

// File is a Device over a raw file: the simplest real device, used as the
// baseline the data plane is benchmarked against and as a backend for
// protocol tests that need real I/O.
type File struct {
	f    *os.File
	size int64
}

// OpenFile opens (creating if needed) a raw file of the given size.
func OpenFile(path string, size int64) (*File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, err
	}
	return &File{f: f, size: size}, nil
}

func (d *File) Size() int64 { return d.size }

func (d *File) ReadAt(p []byte, off int64) (int, error) {
	if err := CheckRange(off, int64(len(p)), d.size); err != nil {
		return 0, err
	}
	return d.f.ReadAt(p, off)
}

func (d *File) WriteAt(p []byte, off int64) (int, error) {
	if err := CheckRange(off, int64(len(p)), d.size); err != nil {
		return 0, err
	}
	return d.f.WriteAt(p, off)
}

func (d *File) Flush() error { return d.f.Sync() }

func (d *File) Unmap(off, length int64) error { return d.WriteZeroes(off, length) }

// WriteZeroes punches a hole: the range reads back as zeros and frees space.
func (d *File) WriteZeroes(off, length int64) error {
	if err := CheckRange(off, length, d.size); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	return unix.Fallocate(int(d.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
}

// Close closes the file.
func (d *File) Close() error { return d.f.Close() }
