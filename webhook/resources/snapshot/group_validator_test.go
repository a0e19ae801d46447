package snapshot

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

const csiUser = "system:serviceaccount:" + ns + ":" + types.CSIControllerServiceAccount

// groupWorld: v1 serves claim apps/c1 and holds 2Mi of live data, over the
// namespace's 1Mi snapshot quota; v2 has no claim; dying is being deleted.
func groupWorld(t *testing.T) *dstest.Env {
	q := resource.MustParse("1Mi")
	rq := &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: "apps"},
		Spec: v1beta1.ResourceQuotaSpec{SnapshotLimit: v1beta1.SnapshotLimit{NamespaceTotalSnapshotSizeQuota: &q}}}
	eng := &v1beta1.Engine{ObjectMeta: metav1.ObjectMeta{Name: "v1-e-0", Namespace: ns},
		Spec:   v1beta1.EngineSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v1"}},
		Status: v1beta1.EngineStatus{Snapshots: map[string]*v1beta1.SnapshotInfo{types.VolumeHeadName: {Size: 2 << 20}}}}
	claim := []runtime.Object{
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-v1"}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: types.CSIDriverName, VolumeHandle: "v1"}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "apps", Name: "c1", UID: "uid-c1"}}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "apps", UID: "uid-c1"},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-v1"}},
	}
	return dstest.New(t, append(objects(), volume("v2"), rq, eng), claim)
}

func TestGroupValidatorCreate(t *testing.T) {
	cases := []struct {
		name    string
		user    string
		volumes []string
		labels  map[string]string
		csiName string
		want    string // "" to allow
	}{
		{name: "a volume without a claim counts in no quota", user: admissiontest.Admin, volumes: []string{"v2"}},
		{name: "charged once against its claims' namespace", user: admissiontest.Admin, volumes: []string{"v1", "v2"},
			want: "SnapshotGroup g would add 2Mi (the live data of volume v1)"},
		{name: "unknown volume", user: admissiontest.Admin, volumes: []string{"v2", "nope"},
			want: `spec.volumes[1]: volume "nope" not found`},
		{name: "volume being deleted", user: admissiontest.Admin, volumes: []string{"dying"},
			want: `spec.volumes[0]: volume "dying" is being deleted`},
		{name: "invalid label", user: admissiontest.Admin, volumes: []string{"v2"}, labels: map[string]string{"a b": "c"},
			want: "spec.labels[a b]"},
		{name: "the CSI driver's group was charged at its VolumeGroupSnapshot", user: csiUser, volumes: []string{"v1"},
			csiName: "groupsnapshot-1"},
		{name: "only the CSI driver marks a group its own", user: admissiontest.Admin, volumes: []string{"v1"},
			csiName: "groupsnapshot-1", want: "metadata.annotations[strata.io/csi-name]: marks a group the CSI driver makes"},
	}
	v := NewGroupValidator(groupWorld(t).DS)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := &v1beta1.SnapshotGroup{ObjectMeta: metav1.ObjectMeta{Name: "g", Namespace: ns},
				Spec: v1beta1.SnapshotGroupSpec{Volumes: tc.volumes, Labels: tc.labels}}
			if tc.csiName != "" {
				g.Annotations = map[string]string{types.AnnotationCSIName: tc.csiName}
			}
			req := &admission.Request{AdmissionRequest: admissiontest.Request(GroupResource, tc.user, nil, g)}
			err := v.Create(req, g)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
