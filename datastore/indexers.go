package datastore

import (
	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Index names. Every by-volume, by-node, by-disk and by-backing-image lookup
// goes through one of these, never through a scan of a whole kind.
const (
	IndexByVolume = "by-volume"
	IndexByNode   = "by-node"
	IndexByDisk   = "by-disk"
	// IndexByDataDirectory finds the replica that names a data directory.
	IndexByDataDirectory = "by-data-directory"
	IndexByBackingImage  = "by-backing-image"
	// IndexByTicketOwner maps TicketOwnerKey values to the VolumeAttachments
	// holding a ticket owned by that object.
	IndexByTicketOwner = "by-ticket-owner"
	// IndexByCloneSource maps a volume to the volumes filled from it
	// (spec.dataSource, either form).
	IndexByCloneSource = "by-clone-source"
	// IndexByRecurringJob maps types.RecurringJobSelectors keys (a job, a
	// group) to the volumes they select.
	IndexByRecurringJob = "by-recurring-job"
	// IndexByMakingJob maps a recurring job's name to what it made.
	IndexByMakingJob = "by-making-job"
)

// indexOn builds an index function from a typed key extractor; objects of
// another type, and empty keys, are left out of the index.
func indexOn[T any](key func(T) string) cache.IndexFunc {
	return func(obj interface{}) ([]string, error) {
		typed, ok := obj.(T)
		if !ok {
			return nil, nil
		}
		if k := key(typed); k != "" {
			return []string{k}, nil
		}
		return nil, nil
	}
}

// The indexers of each kind, in one place.
var (
	// A group snapshot is found by each of its volumes.
	snapshotGroupIndexers = cache.Indexers{
		IndexByVolume: func(obj interface{}) ([]string, error) {
			if g, ok := obj.(*v1beta1.SnapshotGroup); ok {
				return g.Spec.Volumes, nil
			}
			return nil, nil
		},
		IndexByMakingJob: indexOn(func(g *v1beta1.SnapshotGroup) string { return g.Labels[types.LabelRecurringJob] }),
	}
	volumeIndexers = cache.Indexers{
		IndexByBackingImage: indexOn(func(v *v1beta1.Volume) string { return v.Spec.BackingImage }),
		IndexByCloneSource: indexOn(func(v *v1beta1.Volume) string {
			src, _ := types.ParseDataSource(v.Spec.DataSource)
			return src.Volume
		}),
		IndexByRecurringJob: func(obj interface{}) ([]string, error) {
			if v, ok := obj.(*v1beta1.Volume); ok {
				return types.RecurringJobSelectors(v.Labels), nil
			}
			return nil, nil
		},
	}
	engineIndexers = cache.Indexers{
		IndexByVolume: indexOn(func(e *v1beta1.Engine) string { return e.Spec.VolumeName }),
		IndexByNode:   indexOn(func(e *v1beta1.Engine) string { return e.Spec.NodeID }),
	}
	replicaIndexers = cache.Indexers{
		IndexByVolume:        indexOn(func(r *v1beta1.Replica) string { return r.Spec.VolumeName }),
		IndexByNode:          indexOn(func(r *v1beta1.Replica) string { return r.Spec.NodeID }),
		IndexByDisk:          indexOn(func(r *v1beta1.Replica) string { return r.Spec.DiskID }),
		IndexByBackingImage:  indexOn(func(r *v1beta1.Replica) string { return r.Spec.BackingImage }),
		IndexByDataDirectory: indexOn(func(r *v1beta1.Replica) string { return r.Spec.DataDirectoryName }),
	}
	// A node is found by the UUIDs of its disks (a disk's UUID is in its
	// status once the node controller has read the disk's UUID file).
	nodeIndexers = cache.Indexers{
		IndexByDisk: func(obj interface{}) ([]string, error) {
			n, ok := obj.(*v1beta1.Node)
			if !ok {
				return nil, nil
			}
			var uuids []string
			for _, d := range n.Status.DiskStatus {
				if d != nil && d.DiskUUID != "" {
					uuids = append(uuids, d.DiskUUID)
				}
			}
			return uuids, nil
		},
	}
	// An image exported from a volume is found by that volume.
	backingImageIndexers = cache.Indexers{
		IndexByVolume: indexOn(func(bi *v1beta1.BackingImage) string {
			if bi.Spec.SourceType != v1beta1.BackingImageSourceTypeExportFromVolume {
				return ""
			}
			return bi.Spec.SourceParameters[v1beta1.BackingImageParameterVolumeName]
		}),
	}
	snapshotIndexers = cache.Indexers{
		IndexByVolume: indexOn(func(s *v1beta1.Snapshot) string { return s.Spec.Volume }),
	}
	volumeAttachmentIndexers = cache.Indexers{
		IndexByVolume:      indexOn(func(va *v1beta1.VolumeAttachment) string { return va.Spec.Volume }),
		IndexByTicketOwner: indexTicketOwners,
	}
	// A backup names its volume in status once the backup controller has
	// seen it; before that only the label (set on create) says.
	backupIndexers = cache.Indexers{
		IndexByVolume: indexOn(func(b *v1beta1.Backup) string {
			if b.Status.VolumeName != "" {
				return b.Status.VolumeName
			}
			return b.Labels[types.LabelVolume]
		}),
	}
	instanceManagerIndexers = cache.Indexers{
		IndexByNode: indexOn(func(im *v1beta1.InstanceManager) string { return im.Spec.NodeID }),
	}
)
