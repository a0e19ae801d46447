// Package atomicfile replaces files so that a crash or an error leaves either
// the old or the new content under the name, never a torn file.
package atomicfile

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// WriteFile replaces path with data, readable by its owner only (small
// state records).
func WriteFile(path string, data []byte) error {
	return WriteFunc(path, 0o600, func(w io.Writer) error {
		_, err := io.Copy(w, bytes.NewReader(data))
		return err
	})
}

// WriteFunc replaces path with what write writes: a temp file beside it (a
// dot name, so directory scans for real entries skip it), fsync, rename over
// path, fsync of the directory so the rename itself survives a crash. On an
// error the temp file goes and path is untouched.
func WriteFunc(path string, perm os.FileMode, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return Rename(tmp.Name(), path)
}

// Rename moves a finished, fsynced file over path and fsyncs the directory
// so the rename itself survives a crash: the last step of WriteFunc, for
// callers that write their temp file another way (at offsets, or by a tool).
func Rename(tmp, path string) error {
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// MkdirAll creates dir and any missing parents with perm, as os.MkdirAll,
// and fsyncs the parent of every directory it creates, top down: without
// that a crash can lose a new directory's entry, and with it everything
// written (and fsynced) inside. An existing dir is left as it is.
func MkdirAll(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				return &os.PathError{Op: "mkdir", Path: d, Err: syscall.ENOTDIR}
			}
			break
		}
		if !os.IsNotExist(err) || filepath.Dir(d) == d {
			return err
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		if err := os.Mkdir(d, perm); err != nil && !os.IsExist(err) {
			return err
		}
		if err := SyncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// SyncDir fsyncs a directory, making the entries created, renamed or
// removed in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
