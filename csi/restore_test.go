package csi

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func testBackup(name string, state v1beta1.BackupState, size int64, image string) *v1beta1.Backup {
	b := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
		Status: v1beta1.BackupStatus{State: state, VolumeName: "src", VolumeSize: size}}
	if image != "" {
		b.Status.VolumeBackingImageName, b.Status.VolumeBackingImageURL = image, "http://images/"+image+".raw"
		b.Status.VolumeBackingImageChecksum = strings.Repeat("c", 128)
	}
	return b
}

// A StorageClass's fromBackup makes a claim a restore of that backup.
func TestCreateVolumeFromBackup(t *testing.T) {
	backups := []runtime.Object{testBackup("b1", v1beta1.BackupStateCompleted, 8<<20, ""),
		testBackup("running", v1beta1.BackupStateInProgress, 8<<20, ""),
		testBackup("on-image", v1beta1.BackupStateCompleted, 8<<20, "img"),
		testBackup("on-image2", v1beta1.BackupStateCompleted, 8<<20, "img2"),
		&v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: "img2", Namespace: types.DefaultNamespace},
			Spec:   v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeDownload, Checksum: strings.Repeat("c", 128)},
			Status: v1beta1.BackingImageStatus{VirtualSize: 4 << 20}}}
	from := func(backup string) map[string]string { return map[string]string{ParamFromBackup: backup} }
	tests := []struct {
		name       string
		required   int64
		params     map[string]string
		wantCode   codes.Code
		wantMsg    string
		wantSize   int64
		wantImage  string
		wantWrites []string
	}{
		{name: "no capacity asked: the backup's size", params: from("b1"), wantSize: 8 << 20, wantWrites: []string{"create volumes"}},
		{name: "a larger capacity is kept", required: 16 << 20, params: from("b1"), wantSize: 16 << 20, wantWrites: []string{"create volumes"}},
		{name: "a smaller capacity is out of range", required: 4 << 20, params: from("b1"),
			wantCode: codes.OutOfRange, wantMsg: "capacity_range: 4194304 bytes is smaller than backup b1 (8388608 bytes)"},
		{name: "a missing backup", params: from("nope"), wantCode: codes.NotFound, wantMsg: "backup nope"},
		{name: "a backup not completed", params: from("running"), wantCode: codes.Unavailable, wantMsg: `backup running is "InProgress", not Completed`},
		{name: "not a backup name", params: from("B_1"), wantCode: codes.InvalidArgument, wantMsg: `parameter fromBackup="B_1": not a valid backup name`},
		{name: "the backup's image missing: created from the URL it recorded, the claim waits for its fetch", params: from("on-image"),
			wantCode: codes.Unavailable, wantMsg: "backing image img is still being fetched", wantWrites: []string{"create backingimages"}},
		{name: "the backup's image present: the volume goes on it", params: from("on-image2"), wantSize: 8 << 20,
			wantImage: "img2", wantWrites: []string{"create volumes"}},
		{name: "another copy named by the class is kept", params: map[string]string{ParamFromBackup: "on-image", ParamBackingImage: "img2"},
			wantSize: 8 << 20, wantImage: "img2", wantWrites: []string{"create volumes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, env := controllerDriver(t, backups, nil, func(e *dstest.Env) { onCreate(e, detachedOnCreate) })
			resp, err := d.CreateVolume(context.Background(), createReq("pvc-1", tc.required, tc.params))
			assert.Equal(t, tc.wantWrites, writeActions(env), "API writes")
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			assert.Equal(t, tc.wantSize, resp.Volume.CapacityBytes)
			v, err := env.Strata.StrataV1beta1().Volumes(types.DefaultNamespace).Get(context.Background(), "pvc-1", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, tc.params[ParamFromBackup], v.Spec.FromBackup)
			assert.Equal(t, tc.wantImage, v.Spec.BackingImage)
		})
	}
}
