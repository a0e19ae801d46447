package kit

import (
	"fmt"
	"slices"
	"strings"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Readers names, by snapshot, what reads it now: a backup not yet
// finished, a clone still copying. While one does, no recurring task
// deletes the snapshot, and a deleted one stays in the chain: a purge
// changes a removed snapshot's layer in place (it punches what the head
// overwrote or trimmed), which a reader in the middle of it would see.
type Readers map[string][]string

func (r Readers) Names() map[string]bool {
	out := map[string]bool{}
	for name := range r {
		out[name] = true
	}
	return out
}

func (r Readers) Describe(snapshot string) string {
	rs := slices.Clone(r[snapshot])
	slices.Sort(rs)
	return strings.Join(slices.Compact(rs), ", ")
}

// SnapshotReaders lists the readers of the volume's snapshots, from the
// caches' indexes.
func SnapshotReaders(ds *datastore.DataStore, volume string) Readers {
	out := Readers{}
	add := func(snapshot, reader string) {
		if snapshot != "" {
			out[snapshot] = append(out[snapshot], reader)
		}
	}
	if backups, err := ds.Backups.ListByIndexRO(datastore.IndexByVolume, volume); err == nil {
		for _, b := range backups {
			if !BackupFinished(b) {
				add(b.Spec.SnapshotName, "backup "+b.Name)
				add(b.Status.SnapshotName, "backup "+b.Name)
			}
		}
	}
	if clones, err := ds.Volumes.ListByIndexRO(datastore.IndexByCloneSource, volume); err == nil {
		for _, v := range clones {
			if src, ok := types.ParseDataSource(v.Spec.DataSource); ok && !VolumeSettled(v) {
				add(src.Snapshot, "clone "+v.Name)
			}
			if cs := v.Status.CloneStatus; cs != nil && cs.State != v1beta1.VolumeCloneStateCompleted {
				add(cs.Snapshot, "clone "+v.Name)
			}
		}
	}
	return out
}

// WaitingForReaders is the message of a deleted snapshot kept for them.
func WaitingForReaders(snapshot, who string) string {
	return fmt.Sprintf("snapshot %s is removed once %s no longer reads it", snapshot, who)
}
