// Package atomicfile replaces files so that a crash or an error leaves either
// the old or the new content under the name, never a torn file.
package atomicfile

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
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
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
