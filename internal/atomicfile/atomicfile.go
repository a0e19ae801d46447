// Package atomicfile replaces small files so that a crash leaves either the
// old or the new content, never a torn file.
package atomicfile

import (
	"os"
	"path/filepath"
)

// WriteFile replaces path with data: a temp file beside it (a dot name, so
// directory scans for real entries skip it), fsync, rename over path, fsync
// of the directory so the rename itself survives a crash.
func WriteFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
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
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
