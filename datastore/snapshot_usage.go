package datastore

import (
	"sync"

	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// SnapshotUsage keeps, per volume, the bytes its snapshots hold: the sum of
// status.size over the volume's Snapshot CRs not marked removed (the live
// head has no CR and never counts). It is kept from the Snapshot informer's
// events one snapshot at a time, so a quota's usage is a sum over the
// namespace's volumes, never a walk over every snapshot.
//
// Written by hand because no informer helper keeps an aggregate: it records
// what each snapshot last contributed, so a missed old object (a relist)
// still yields the right delta.
type SnapshotUsage struct {
	mu       sync.RWMutex
	bySnap   map[string]snapshotCharge // cache key → what it counts for
	byVolume map[string]int64
	onChange []func(volume string)
}

type snapshotCharge struct {
	volume string
	bytes  int64
}

func newSnapshotUsage() *SnapshotUsage {
	return &SnapshotUsage{bySnap: map[string]snapshotCharge{}, byVolume: map[string]int64{}}
}

// VolumeBytes is what the volume's snapshots hold now.
func (u *SnapshotUsage) VolumeBytes(volume string) int64 {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.byVolume[volume]
}

// OnChange calls f with a volume whose total changed, after the change is
// visible to VolumeBytes. Register before the informers start.
func (u *SnapshotUsage) OnChange(f func(volume string)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.onChange = append(u.onChange, f)
}

func (u *SnapshotUsage) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { u.record(obj, false) },
		UpdateFunc: func(_, obj any) { u.record(obj, false) },
		DeleteFunc: func(obj any) { u.record(obj, true) },
	}
}

func (u *SnapshotUsage) record(obj any, deleted bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = tomb.Obj, true
	}
	snap, ok := obj.(*v1beta1.Snapshot)
	if !ok {
		return
	}
	key, err := cache.MetaNamespaceKeyFunc(snap)
	if err != nil {
		return
	}
	var now snapshotCharge
	if !deleted {
		now.volume = snap.Spec.Volume
		if !snap.Status.MarkRemoved {
			now.bytes = snap.Status.Size
		}
	}
	changed := u.apply(key, now)
	for _, volume := range changed {
		for _, f := range u.listeners() {
			f(volume)
		}
	}
}

// apply records a snapshot's new charge and returns the volumes whose
// totals moved.
func (u *SnapshotUsage) apply(key string, now snapshotCharge) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	was := u.bySnap[key]
	if was == now {
		return nil
	}
	if now.volume == "" {
		delete(u.bySnap, key)
	} else {
		u.bySnap[key] = now
	}
	var changed []string
	if was.volume != "" && was.bytes != 0 {
		u.add(was.volume, -was.bytes)
		changed = append(changed, was.volume)
	}
	if now.volume != "" && now.bytes != 0 {
		u.add(now.volume, now.bytes)
		if now.volume != was.volume || was.bytes == 0 {
			changed = append(changed, now.volume)
		}
	}
	return changed
}

func (u *SnapshotUsage) add(volume string, delta int64) {
	if total := u.byVolume[volume] + delta; total != 0 {
		u.byVolume[volume] = total
	} else {
		delete(u.byVolume, volume)
	}
}

func (u *SnapshotUsage) listeners() []func(string) {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.onChange
}
