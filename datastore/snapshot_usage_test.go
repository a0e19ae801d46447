package datastore

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func usageSnap(name, volume string, size int64, removed bool) *v1beta1.Snapshot {
	return &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "strata-system"},
		Spec:   v1beta1.SnapshotSpec{Volume: volume},
		Status: v1beta1.SnapshotStatus{Size: size, MarkRemoved: removed}}
}

// TestSnapshotUsage feeds informer events and checks the per-volume totals
// and which volumes were reported changed.
func TestSnapshotUsage(t *testing.T) {
	type event struct {
		op  string // add, update, delete, tombstone
		obj *v1beta1.Snapshot
	}
	cases := []struct {
		name        string
		events      []event
		want        map[string]int64
		wantChanged []string
	}{
		{name: "adds sum per volume",
			events: []event{{"add", usageSnap("s1", "v1", 10, false)}, {"add", usageSnap("s2", "v1", 5, false)},
				{"add", usageSnap("s3", "v2", 7, false)}},
			want: map[string]int64{"v1": 15, "v2": 7}, wantChanged: []string{"v1", "v1", "v2"}},
		{name: "a snapshot that grows counts its new size once",
			events: []event{{"add", usageSnap("s1", "v1", 10, false)}, {"update", usageSnap("s1", "v1", 30, false)}},
			want:   map[string]int64{"v1": 30}, wantChanged: []string{"v1", "v1"}},
		{name: "marked removed stops counting",
			events: []event{{"add", usageSnap("s1", "v1", 10, false)}, {"update", usageSnap("s1", "v1", 10, true)}},
			want:   map[string]int64{}, wantChanged: []string{"v1", "v1"}},
		{name: "an update that changes nothing counted reports nothing",
			events: []event{{"add", usageSnap("s1", "v1", 10, false)}, {"update", usageSnap("s1", "v1", 10, false)}},
			want:   map[string]int64{"v1": 10}, wantChanged: []string{"v1"}},
		{name: "a size-0 snapshot reports nothing",
			events: []event{{"add", usageSnap("s1", "v1", 0, false)}},
			want:   map[string]int64{}},
		{name: "delete, and a delete only a relist saw",
			events: []event{{"add", usageSnap("s1", "v1", 10, false)}, {"add", usageSnap("s2", "v1", 4, false)},
				{"delete", usageSnap("s1", "v1", 10, false)}, {"tombstone", usageSnap("s2", "v1", 4, false)}},
			want: map[string]int64{}, wantChanged: []string{"v1", "v1", "v1", "v1"}},
		{name: "an add replayed by a relist does not count twice",
			events: []event{{"add", usageSnap("s1", "v1", 10, false)}, {"add", usageSnap("s1", "v1", 10, false)}},
			want:   map[string]int64{"v1": 10}, wantChanged: []string{"v1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := newSnapshotUsage()
			var changed []string
			u.OnChange(func(v string) { changed = append(changed, v) })
			h := u.handler()
			for _, e := range tc.events {
				switch e.op {
				case "add":
					h.OnAdd(e.obj, false)
				case "update":
					h.OnUpdate(nil, e.obj)
				case "delete":
					h.OnDelete(e.obj)
				case "tombstone":
					h.OnDelete(cache.DeletedFinalStateUnknown{Key: "strata-system/" + e.obj.Name, Obj: e.obj})
				}
			}
			assert.Equal(t, tc.want, u.byVolume)
			for v, n := range tc.want {
				assert.Equal(t, n, u.VolumeBytes(v))
			}
			assert.Equal(t, tc.wantChanged, changed)
		})
	}
}
