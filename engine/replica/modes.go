package replica

import (
	"fmt"
	"os"
	"path/filepath"
)

// A replica's files hold a volume's data: readable by the instance
// manager's user only (issue 24 found layers 0644 in 0755 directories,
// which let any local user read every volume of the node).
const (
	fileMode os.FileMode = 0o600
	dirMode  os.FileMode = 0o700
)

// tightenModes takes group and other access away from the directory and
// the files of a replica made before the modes above, so an upgrade
// protects existing volumes too. The backing file is not the replica's.
func (r *Replica) tightenModes() error {
	if err := tighten(r.dir, dirMode); err != nil {
		return err
	}
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return fmt.Errorf("open replica %s: %w", r.dir, err)
	}
	for _, e := range entries {
		if n := e.Name(); e.Type().IsRegular() && (n == volumeMetaFile || isLayerFile(n)) {
			if err := tighten(filepath.Join(r.dir, n), fileMode); err != nil {
				return err
			}
		}
	}
	return nil
}

func tighten(path string, want os.FileMode) error {
	st, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("open replica: %w", err)
	}
	if st.Mode().Perm()&^want == 0 {
		return nil
	}
	if err := os.Chmod(path, st.Mode().Perm()&want); err != nil {
		return fmt.Errorf("open replica: restricting %s to its owner: %w", path, err)
	}
	return nil
}
