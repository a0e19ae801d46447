package volume

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

func snapshot(name, volume string) *v1beta1.Snapshot {
	return &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1beta1.SnapshotSpec{Volume: volume}}
}

// A volume can be filled from an existing snapshot or volume no larger than
// itself; a source that is missing or going is refused.
func TestValidatorDataSource(t *testing.T) {
	deleting := snapshot("going", "src")
	deleting.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
	deleting.Finalizers = []string{"strata.io/cleanup"}
	goingVol := vol(func(v *v1beta1.Volume) {
		v.Name = "going-vol"
		v.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
		v.Finalizers = []string{"strata.io/cleanup"}
	})
	big := snapshot("big", "src")
	big.Status.RestoreSize = 2 << 30
	objects := append(threeNodes(), vol(func(v *v1beta1.Volume) { v.Name = "src" }), goingVol,
		vol(func(v *v1beta1.Volume) { v.Name = "src-2g"; v.Spec.Size = resource.MustParse("2Gi") }),
		snapshot("s1", "src"), snapshot("theirs", "other"), deleting, big)
	withSource := func(src string) *v1beta1.Volume {
		return vol(func(v *v1beta1.Volume) { v.Name = "clone"; v.Spec.DataSource = src })
	}
	tests := []struct {
		name    string
		obj     *v1beta1.Volume
		wantMsg string
	}{
		{name: "no data source", obj: withSource("")},
		{name: "an existing snapshot", obj: withSource("snap://src/s1")},
		{name: "an existing volume", obj: withSource("vol://src")},
		{name: "a snapshot that does not exist",
			obj:     withSource("snap://src/nope"),
			wantMsg: `spec.dataSource: snapshot "nope" of volume "src" does not exist`},
		{name: "a snapshot of another volume",
			obj:     withSource("snap://src/theirs"),
			wantMsg: `spec.dataSource: snapshot "theirs" belongs to volume "other", not "src"`},
		{name: "a snapshot being deleted",
			obj:     withSource("snap://src/going"),
			wantMsg: `spec.dataSource: snapshot "going" of volume "src" is being deleted`},
		{name: "a volume that does not exist",
			obj:     withSource("vol://nope"),
			wantMsg: `spec.dataSource: volume "nope" does not exist`},
		{name: "a volume being deleted",
			obj:     withSource("vol://going-vol"),
			wantMsg: `spec.dataSource: volume "going-vol" is being deleted`},
		{name: "a volume larger than the clone",
			obj:     withSource("vol://src-2g"),
			wantMsg: `spec.size: 1073741824 bytes is smaller than the data source (volume src-2g has 2147483648 bytes)`},
		{name: "a snapshot larger than the clone",
			obj:     withSource("snap://src/big"),
			wantMsg: `spec.size: 1073741824 bytes is smaller than the data source (snapshot big has 2147483648 bytes)`},
		{name: "not a data source",
			obj:     withSource("http://x"),
			wantMsg: `spec.dataSource: "http://x" is not a data source: expected snap://<volume>/<snapshot> or vol://<volume>`},
	}
	env := dstest.New(t, objects, nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}

	t.Run("an update is not judged on its source: it may be gone by now", func(t *testing.T) {
		old := withSource("snap://src/gone")
		resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, old, old.DeepCopy()))
		assert.Empty(t, admissiontest.Denial(resp))
	})
}

// A volume is built on an existing backing image only: its replicas would
// wait forever for a missing one.
func TestValidatorBackingImage(t *testing.T) {
	going := &v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: "going", Namespace: ns,
		DeletionTimestamp: &metav1.Time{Time: dstest.Now}, Finalizers: []string{"strata.io/cleanup"}}}
	objects := append(threeNodes(), &v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: "ubuntu", Namespace: ns}}, going)
	tests := []struct {
		name, image, wantMsg string
	}{
		{name: "an existing image", image: "ubuntu"},
		{name: "no image", image: ""},
		{name: "a missing image", image: "nope", wantMsg: `spec.backingImage: backing image "nope" not found; create it first`},
		{name: "an image being deleted", image: "going", wantMsg: `spec.backingImage: backing image "going" is being deleted`},
	}
	env := dstest.New(t, objects, nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obj := vol(func(v *v1beta1.Volume) { v.Spec.BackingImage = tc.image })
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}
