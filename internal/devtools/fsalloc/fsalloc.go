// Package fsalloc reads what files hold on disk (st_blocks), not their
// length: how tests see the space sparse layer files really take.
package fsalloc

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// Files is the allocated bytes of each file in dir, by name; a file
// removed while it reads is left out.
func Files(dir string) (map[string]int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(entries))
	for _, e := range entries {
		var st syscall.Stat_t
		err := syscall.Stat(filepath.Join(dir, e.Name()), &st)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed since ReadDir: a live replica's purge
		}
		if err != nil {
			return nil, err
		}
		out[e.Name()] = st.Blocks * 512
	}
	return out, nil
}

// Dir is the allocated bytes of every file in dir.
func Dir(dir string) (int64, error) {
	files, err := Files(dir)
	var n int64
	for _, b := range files {
		n += b
	}
	return n, err
}
