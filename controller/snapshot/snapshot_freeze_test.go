package snapshot

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func setting(name types.SettingName, value string) *v1beta1.Setting {
	return &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(name), Namespace: fixture.NS}, Value: value}
}

// Whether, and for how long, a snapshot of a volume freezes its
// filesystem: the volume's field over the setting, the setting's bound.
func TestFSFreezeFor(t *testing.T) {
	for name, tc := range map[string]struct {
		settings []runtime.Object
		volume   v1beta1.FreezeFilesystem
		want     time.Duration
	}{
		"defaults: freeze for 10 s":           {nil, "", 10 * time.Second},
		"ignored follows the setting":         {nil, v1beta1.FreezeFilesystemIgnored, 10 * time.Second},
		"the volume turns it off":             {nil, v1beta1.FreezeFilesystemDisabled, 0},
		"the setting turns it off":            {[]runtime.Object{setting(types.SettingFreezeFilesystemForSnapshot, "false")}, "", 0},
		"the volume turns it on over it":      {[]runtime.Object{setting(types.SettingFreezeFilesystemForSnapshot, "false")}, v1beta1.FreezeFilesystemEnabled, 10 * time.Second},
		"the timeout setting":                 {[]runtime.Object{setting(types.SettingFreezeFilesystemTimeout, "3")}, "", 3 * time.Second},
		"an unreadable timeout keeps 10 s":    {[]runtime.Object{setting(types.SettingFreezeFilesystemTimeout, "abc")}, "", 10 * time.Second},
		"an unreadable switch keeps freezing": {[]runtime.Object{setting(types.SettingFreezeFilesystemForSnapshot, "maybe")}, "", 10 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			env := dstest.New(t, tc.settings, nil)
			vol := fixture.Volume(func(v *v1beta1.Volume) { v.Spec.FreezeFilesystemForSnapshot = tc.volume })
			assert.Equal(t, tc.want, fsFreezeFor(env.DS, vol))
		})
	}
}

// The Snapshot CR shows the consistency label as status.consistency and
// the user's labels without it.
func TestMirrorSnapshotConsistency(t *testing.T) {
	for name, tc := range map[string]struct {
		labels     map[string]string
		want       string
		wantLabels map[string]string
	}{
		"filesystem":           {map[string]string{"strata.io/consistency": "filesystem", "app": "db"}, "filesystem", map[string]string{"app": "db"}},
		"crash, no user label": {map[string]string{"strata.io/consistency": "crash"}, "crash", nil},
		"taken before it":      {map[string]string{"app": "db"}, "", map[string]string{"app": "db"}},
	} {
		t.Run(name, func(t *testing.T) {
			s := fixture.Snapshot("s1", true)
			mirrorSnapshot(s, snapshotView{vol: fixture.Volume(), eng: fixture.Engine(), info: &v1beta1.SnapshotInfo{Labels: tc.labels}})
			assert.Equal(t, tc.want, s.Status.Consistency)
			assert.Equal(t, tc.wantLabels, s.Status.Labels)
		})
	}
}
