// Package atomicfile replaces files so that a crash or an error leaves either
// the old or the new content under the name, never a torn file, and makes
// the directory entries it creates and removes durable.
package atomicfile

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
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

// WriteFunc replaces path with what write writes: a temp file beside it
// (writeTemp), rename over path, fsync of the directory so the rename
// itself survives a crash. On an error the temp file goes and path is
// untouched. The file gets perm exactly: it is set with chmod, which the
// umask does not narrow.
func WriteFunc(path string, perm os.FileMode, write func(io.Writer) error) error {
	tmp, err := writeTemp(path, perm, write)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // no-op after the rename
	return Rename(tmp, path)
}

// CreateFunc is WriteFunc for a path that must not exist: the temp file is
// link(2)ed to path instead of renamed over it, and link fails if path
// exists, so of two racing writers exactly one wins, on local disks and on
// NFS alike (O_EXCL was unreliable on NFSv2). The loser's error wraps
// fs.ErrExist. The temp name is removed before the directory's fsync, so
// that one fsync makes the new entry durable and leaves no temp behind.
func CreateFunc(path string, perm os.FileMode, write func(io.Writer) error) error {
	tmp, err := writeTemp(path, perm, write)
	if err != nil {
		return err
	}
	err = os.Link(tmp, path)
	_ = os.Remove(tmp)
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// writeTemp writes a temp file beside path (a dot name, so directory scans
// for real entries skip it) with perm and fsyncs it, so that once a rename
// or link puts it in place its content is on disk. On an error it is gone.
func writeTemp(path string, perm os.FileMode, write func(io.Writer) error) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", err
	}
	err = write(tmp)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return "", err
	}
	return tmp.Name(), nil
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

// Remove removes path and fsyncs its directory, so the removal survives a
// crash: without that a deleted file can come back after others that were
// deleted after it stay gone. A missing path is no error, and its directory
// is synced all the same, since a remove that crashed before its fsync may
// not be durable yet; a missing directory has nothing to sync.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := SyncDir(filepath.Dir(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
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
