package replica

import (
	"fmt"
	"path/filepath"
)

// OpenWithBackingFile opens the replica in dir, first pointing its
// volume.meta at backingFile when the replica sits on a backing file kept
// at another path: its disk was remounted elsewhere, and the image's copy
// moved with it, so the recorded absolute path is stale. The new file must
// pass the same checks as at creation. An empty backingFile is Open.
func OpenWithBackingFile(dir, backingFile string) (*Replica, error) {
	if backingFile == "" {
		return Open(dir)
	}
	vol, err := loadVolumeMeta(dir)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(backingFile)
	if err != nil {
		return nil, fmt.Errorf("open replica %s: backing file: %w", dir, err)
	}
	if vol.BackingFile != "" && vol.BackingFile != abs {
		if err := checkBackingFile(abs, vol.Size); err != nil {
			return nil, fmt.Errorf("open replica %s: new backing file path: %w", dir, err)
		}
		vol.BackingFile = abs
		if _, err := commitVolumeMeta(dir, vol); err != nil {
			return nil, fmt.Errorf("open replica %s: recording the backing file's new path: %w", dir, err)
		}
	}
	return Open(dir)
}
