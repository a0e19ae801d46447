package node

import (
	"github.com/strata-storage/strata/internal/atomicfile"

	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// DiskConfig is a disk this manager registers for its node when it first
// creates the node's Node CR; later changes are made on the CR.
type DiskConfig struct {
	Name string
	Path string
}

// diskInfo is what a disk directory says about itself.
type diskInfo struct {
	UUID      string
	Total     int64
	Available int64
}

// diskError carries the condition reason a disk failure is reported with.
type diskError struct {
	reason string
	err    error
}

func (e *diskError) Error() string { return e.err.Error() }
func (e *diskError) Unwrap() error { return e.err }

type diskConfigFile struct {
	DiskUUID string `json:"diskUUID"`
}

// inspectDisk reads a disk's identity and space. A disk without a config
// file gets one with a new UUID; a config file that does not parse is
// reported, never overwritten, since the UUID ties replicas to the disk.
//
// known is the UUID this disk entry had; a disk that had one and now has no
// config file is not given a new one: the directory is most likely the empty
// mount point of an unmounted disk, and a new identity there would make its
// replicas look lost rather than the disk look missing.
func inspectDisk(path, known string) (diskInfo, error) {
	var info diskInfo
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() {
		if err == nil {
			err = fmt.Errorf("%s is not a directory", path)
		}
		return info, &diskError{v1beta1.DiskConditionReasonPathMissing, err}
	}
	info.UUID, err = readOrCreateDiskUUID(path, known == "")
	if errors.Is(err, errNoDiskConfig) {
		return info, &diskError{v1beta1.DiskConditionReasonPathMissing, fmt.Errorf(
			"%s has no disk config (it was disk %s): is the disk unmounted? Mount it again, or add it where it is now", path, known)}
	}
	if err != nil {
		return info, &diskError{v1beta1.DiskConditionReasonUUIDError, err}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return info, &diskError{v1beta1.DiskConditionReasonPathMissing, fmt.Errorf("statfs %s: %w", path, err)}
	}
	info.Total = int64(fs.Blocks) * fs.Bsize
	info.Available = int64(fs.Bavail) * fs.Bsize
	return info, nil
}

// errNoDiskConfig: the disk directory has no config file, and none is made.
var errNoDiskConfig = errors.New("no disk config")

// readOrCreateDiskUUID reads the disk's UUID file, creating one with a new
// UUID when there is none and create is set.
func readOrCreateDiskUUID(dir string, create bool) (string, error) {
	file := filepath.Join(dir, types.DiskConfigFile)
	data, err := os.ReadFile(file)
	if err == nil {
		var cfg diskConfigFile
		if err := json.Unmarshal(data, &cfg); err != nil || cfg.DiskUUID == "" {
			return "", fmt.Errorf("disk config %s is damaged (want JSON with diskUUID); fix or remove it by hand", file)
		}
		return cfg.DiskUUID, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("reading disk config: %w", err)
	}
	if !create {
		return "", errNoDiskConfig
	}
	cfg := diskConfigFile{DiskUUID: uuid.NewString()}
	data, _ = json.Marshal(cfg)
	if err := atomicfile.WriteFile(file, data); err != nil {
		return "", fmt.Errorf("writing disk config: %w", err)
	}
	return cfg.DiskUUID, nil
}

// stableAvailable keeps the reported free space unless it moved by more than
// a small share of the disk, so ordinary I/O does not rewrite the Node CR.
func stableAvailable(previous, current, total int64) int64 {
	threshold := total / 100
	threshold = max(threshold, 1<<20)
	threshold = min(threshold, 256<<20)
	if previous > 0 && abs64(current-previous) < threshold {
		return previous
	}
	return current
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// onlyFreeSpaceMoved reports whether fresh differs from old in free space
// alone: StorageAvailable, and the free-bytes figure that leads a DiskFull
// message. Anything else placement or an admin reads (the set of disks,
// UUIDs, sizes, replicas, orphans, a condition's status, reason or the rest
// of its message) makes it false, as does no difference at all.
func onlyFreeSpaceMoved(old, fresh map[string]*v1beta1.DiskStatus) bool {
	if len(old) != len(fresh) || equality.Semantic.DeepEqual(old, fresh) {
		return false
	}
	for name, f := range fresh {
		o, ok := old[name]
		if !ok || (o == nil) != (f == nil) {
			return false
		}
		if o != nil && !equality.Semantic.DeepEqual(DiskStatusWithoutFreeSpace(o), DiskStatusWithoutFreeSpace(f)) {
			return false
		}
	}
	return true
}

// DiskStatusWithoutFreeSpace is st with its free-space figures blanked: the
// available bytes, and the leading number of a DiskFull message
// (diskSchedulable's "%d bytes free after ..."; the rest of the message
// still counts). bench-scale classifies Node writes with it too.
func DiskStatusWithoutFreeSpace(st *v1beta1.DiskStatus) *v1beta1.DiskStatus {
	c := st.DeepCopy()
	c.StorageAvailable = 0
	for i := range c.Conditions {
		if c.Conditions[i].Reason == v1beta1.DiskConditionReasonFull {
			c.Conditions[i].Message = strings.TrimLeft(c.Conditions[i].Message, "0123456789")
		}
	}
	return c
}
