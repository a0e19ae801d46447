package snapshot

import (
	"maps"
	"time"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/fsfreeze"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// fsFreezeFor is how long a snapshot of vol may hold the volume's
// filesystem frozen on its node (engine/imserver/fsfreeze.go), 0 for
// none: the volume's spec.freezeFilesystemForSnapshot, else the
// freeze-filesystem-for-snapshot setting. A setting that cannot be read
// keeps its default (freeze for 10 s): a snapshot that misses what the
// application wrote is the failure this guards against.
func fsFreezeFor(ds *datastore.DataStore, vol *v1beta1.Volume) time.Duration {
	switch vol.Spec.FreezeFilesystemForSnapshot {
	case v1beta1.FreezeFilesystemDisabled:
		return 0
	case v1beta1.FreezeFilesystemEnabled:
	default:
		if on, err := ds.GetSettingBool(types.SettingFreezeFilesystemForSnapshot); err == nil && !on {
			return 0
		}
	}
	secs, err := ds.GetSettingInt(types.SettingFreezeFilesystemTimeout)
	if err != nil || secs <= 0 {
		secs = 10
	}
	return time.Duration(secs) * time.Second
}

// snapshotConsistency reads what a snapshot holds from the label the
// instance manager sets on it; "" for a snapshot taken before it did.
func snapshotConsistency(labels map[string]string) string { return labels[fsfreeze.ConsistencyLabel] }

// withoutConsistency is a snapshot's labels as the user set them: status
// says the consistency in a field of its own.
func withoutConsistency(labels map[string]string) map[string]string {
	if _, ok := labels[fsfreeze.ConsistencyLabel]; !ok {
		return labels
	}
	out := maps.Clone(labels)
	delete(out, fsfreeze.ConsistencyLabel)
	if len(out) == 0 {
		return nil
	}
	return out
}
