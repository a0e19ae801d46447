package volume

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

var (
	sumA = strings.Repeat("a", 128)
	sumB = strings.Repeat("b", 128)
)

func backup(name string, change func(*v1beta1.Backup)) *v1beta1.Backup {
	b := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Status: v1beta1.BackupStatus{State: v1beta1.BackupStateCompleted, VolumeName: "src", VolumeSize: 1 << 30}}
	if change != nil {
		change(b)
	}
	return b
}

func image(name, sum string) *v1beta1.BackingImage {
	return &v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeDownload, Checksum: sum}}
}

func restoreObjects() []runtime.Object {
	onImage := func(b *v1beta1.Backup) {
		b.Status.VolumeBackingImageName, b.Status.VolumeBackingImageChecksum = "ubuntu", sumA
		b.Status.VolumeBackingImageURL = "http://images/ubuntu.raw"
	}
	going := backup("going", nil)
	going.DeletionTimestamp, going.Finalizers = &metav1.Time{Time: dstest.Now}, []string{"strata.io/cleanup"}
	return append(threeNodes(), backup("b1", nil), backup("on-image", onImage), going,
		backup("running", func(b *v1beta1.Backup) { b.Status.State = v1beta1.BackupStateInProgress }),
		backup("big", func(b *v1beta1.Backup) { b.Status.VolumeSize = 2 << 30 }),
		backup("gone-image", func(b *v1beta1.Backup) { onImage(b); b.Status.VolumeBackingImageName = "retired" }),
		image("ubuntu", sumA), image("ubuntu-copy", sumA), image("debian", sumB))
}

// A restore names a completed backup no larger than the volume, and a
// backing image with the checksum the backup recorded.
func TestValidatorFromBackup(t *testing.T) {
	restore := func(backup, image string) *v1beta1.Volume {
		return vol(func(v *v1beta1.Volume) { v.Name = "restored"; v.Spec.FromBackup = backup; v.Spec.BackingImage = image })
	}
	tests := []struct {
		name    string
		obj     *v1beta1.Volume
		wantMsg string
	}{
		{name: "a completed backup", obj: restore("b1", "")},
		{name: "the backup's own backing image", obj: restore("on-image", "ubuntu")},
		{name: "another copy of the backup's backing image", obj: restore("on-image", "ubuntu-copy")},
		{name: "a backup without an image onto an image", obj: restore("b1", "debian")},
		{name: "a backup that does not exist", obj: restore("nope", ""),
			wantMsg: `spec.fromBackup: backup "nope" not found in namespace ` + ns},
		{name: "a backup being deleted", obj: restore("going", ""),
			wantMsg: `spec.fromBackup: backup "going" is being deleted`},
		{name: "a backup not completed", obj: restore("running", ""),
			wantMsg: `spec.fromBackup: backup "running" is InProgress; only a Completed backup can be restored`},
		{name: "a backup larger than the volume", obj: restore("big", ""),
			wantMsg: `spec.size: 1073741824 bytes is smaller than backup "big" of volume src (2147483648 bytes)`},
		{name: "another image than the backup's", obj: restore("on-image", "debian"),
			wantMsg: `spec.backingImage: backing image "debian" (checksum ` + sumB + `) is not the image backup "on-image" was taken over (ubuntu, checksum ` + sumA + `); name a copy with the same checksum`},
		{name: "the backup's image no longer in the cluster", obj: restore("gone-image", "retired"),
			wantMsg: `spec.backingImage: backing image "retired", which backup "gone-image" was taken over, not found; create it (it was downloaded from http://images/ubuntu.raw) with checksum ` + sumA + `, or name another copy of it; spec.backingImage: backing image "retired" not found; create it first`},
		{name: "with a data source too", obj: vol(func(v *v1beta1.Volume) { v.Spec.FromBackup = "b1"; v.Spec.DataSource = "vol://src" }),
			wantMsg: `spec.dataSource: volume "src" does not exist; spec.fromBackup: cannot be set together with spec.dataSource "vol://src"; a volume is filled from one source`},
	}
	env := dstest.New(t, restoreObjects(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
	t.Run("fromBackup is immutable", func(t *testing.T) {
		resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, restore("b1", ""), restore("on-image", "")))
		assert.Equal(t, `spec.fromBackup: is immutable: cannot change from "b1" to "on-image"`, admissiontest.Denial(resp))
	})
}

// A restore without a backing image named takes the backup's.
func TestMutatorFromBackupTakesTheBackupsImage(t *testing.T) {
	tests := []struct {
		name, backup, image, want string
	}{
		{name: "unset takes the backup's", backup: "on-image", want: "ubuntu"},
		{name: "a named copy is kept", backup: "on-image", image: "ubuntu-copy", want: "ubuntu-copy"},
		{name: "a backup without an image leaves it unset", backup: "b1"},
		{name: "a missing backup is left to the validator", backup: "nope"},
	}
	env := dstest.New(t, restoreObjects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := vol(func(v *v1beta1.Volume) { v.Spec.FromBackup = tc.backup; v.Spec.BackingImage = tc.image })
			resp, obj := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, nil, v))
			require.True(t, resp.Allowed, admissiontest.Denial(resp))
			assert.Equal(t, tc.want, obj.(*v1beta1.Volume).Spec.BackingImage)
		})
	}
}
