package kit

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// EngineRunning tells whether the engine runs on its node as asked.
func EngineRunning(e *v1beta1.Engine) bool {
	return e != nil && e.Spec.NodeID != "" && e.Spec.DesireState == v1beta1.InstanceStateRunning &&
		e.Status.CurrentState == v1beta1.InstanceStateRunning
}

// DerivedSnapshotName is prefix-<24 hex digits of key's SHA-256>: a valid
// snapshot name, the same for the same key, where the natural one is not.
func DerivedSnapshotName(prefix, key string) string {
	sum := sha256.Sum256([]byte(key))
	return prefix + "-" + hex.EncodeToString(sum[:12])
}

func CloneIncomplete(vol *v1beta1.Volume) bool {
	return vol.Spec.DataSource != "" &&
		(vol.Status.CloneStatus == nil || vol.Status.CloneStatus.State != v1beta1.VolumeCloneStateCompleted)
}

func RestoreIncomplete(vol *v1beta1.Volume) bool {
	return vol.Spec.FromBackup != "" &&
		(vol.Status.RestoreStatus == nil || vol.Status.RestoreStatus.State != v1beta1.VolumeRestoreStateCompleted)
}

// PurgeDrops tells whether a purge takes a removed snapshot out of the
// chain: a leaf is deleted, one with a single snapshot child is coalesced
// into it; one under the head is only pruned.
func PurgeDrops(info *v1beta1.SnapshotInfo) bool {
	switch len(info.Children) {
	case 0:
		return true
	case 1:
		return !info.Children[types.VolumeHeadName]
	}
	return false
}

func IsPurging(e *v1beta1.Engine) bool {
	for _, p := range e.Status.PurgeStatus {
		if p != nil && p.IsPurging {
			return true
		}
	}
	return false
}

// VolumeSettled: not being deleted, and not being filled by a clone or a
// restore.
func VolumeSettled(v *v1beta1.Volume) bool {
	if v.DeletionTimestamp != nil {
		return false
	}
	if cs := v.Status.CloneStatus; cs != nil && cs.State != v1beta1.VolumeCloneStateCompleted {
		return false
	}
	if rs := v.Status.RestoreStatus; rs != nil && rs.State != v1beta1.VolumeRestoreStateCompleted {
		return false
	}
	return true
}

// InstanceAddress is the dataconn address a running replica serves on.
func InstanceAddress(st *v1beta1.InstanceStatus) string {
	if st.IP == "" || st.Port == 0 {
		return ""
	}
	return net.JoinHostPort(st.IP, strconv.Itoa(int(st.Port)))
}

// InstanceManagerName is the InstanceManager CR of a node.
func InstanceManagerName(node string) string { return "im-" + node }

// BackupFinished tells whether a backup has ended, completed or failed.
func BackupFinished(b *v1beta1.Backup) bool {
	return b.Status.State == v1beta1.BackupStateCompleted || b.Status.State == v1beta1.BackupStateError
}

// Where a backing image's copy lives on a disk:
// <disk>/backing-images/<name>-<uuid>/backing. Replicas on the disk open
// that one file read-only at the bottom of their chains.
const (
	BackingImagesDir = "backing-images"
	BackingFileName  = "backing"
)

// BackingImageDir is the directory of an image's copy on the disk at diskPath.
func BackingImageDir(diskPath, image, uuid string) string {
	return filepath.Join(diskPath, BackingImagesDir, image+"-"+uuid)
}

// BackingImageFile is the image's file on the disk at diskPath.
func BackingImageFile(diskPath string, bi *v1beta1.BackingImage) string {
	return filepath.Join(BackingImageDir(diskPath, bi.Name, bi.Status.UUID), BackingFileName)
}

// ReadyCopies lists the disks in spec whose copy is ready, sorted.
func ReadyCopies(bi *v1beta1.BackingImage) []string {
	var out []string
	for disk, st := range bi.Status.DiskFileStatusMap {
		if _, wanted := bi.Spec.DiskFileSpecMap[disk]; wanted && st != nil && st.State == v1beta1.BackingImageStateReady {
			out = append(out, disk)
		}
	}
	slices.Sort(out)
	return out
}
