package volume

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

func snapshot(name, volume string) *v1beta1.Snapshot {
	return &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1beta1.SnapshotSpec{Volume: volume}}
}

func TestParseDataSource(t *testing.T) {
	tests := []struct {
		in       string
		want     dataSource
		wantOK   bool
		wantText string
	}{
		{in: "snap://v1/s1", want: dataSource{volume: "v1", snapshot: "s1"}, wantOK: true},
		{in: "vol://v1", want: dataSource{volume: "v1"}, wantOK: true},
		{in: "snap://v1"},
		{in: "snap://v1/"},
		{in: "snap:///s1"},
		{in: "snap://v1/s1/x"},
		{in: "vol://"},
		{in: "vol://v1/s1"},
		{in: "http://x"},
		{in: "v1"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := parseDataSource(tc.in)
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

// Until the clone controller exists, every data source is refused as not
// available; a source that does not exist is refused also, by a rule that
// stays when cloning arrives.
func TestValidatorDataSource(t *testing.T) {
	const notYet = "spec.dataSource: cloning is not available yet; create the volume without a data source"
	deleting := snapshot("going", "src")
	deleting.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
	deleting.Finalizers = []string{"strata.io/cleanup"}
	goingVol := vol(func(v *v1beta1.Volume) {
		v.Name = "going-vol"
		v.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
		v.Finalizers = []string{"strata.io/cleanup"}
	})
	objects := append(threeNodes(), vol(func(v *v1beta1.Volume) { v.Name = "src" }), goingVol,
		snapshot("s1", "src"), snapshot("theirs", "other"), deleting)
	withSource := func(src string) *v1beta1.Volume {
		return vol(func(v *v1beta1.Volume) { v.Name = "clone"; v.Spec.DataSource = src })
	}
	tests := []struct {
		name    string
		obj     *v1beta1.Volume
		wantMsg string
	}{
		{name: "no data source", obj: withSource("")},
		{name: "an existing snapshot", obj: withSource("snap://src/s1"), wantMsg: notYet},
		{name: "an existing volume", obj: withSource("vol://src"), wantMsg: notYet},
		{name: "a snapshot that does not exist",
			obj:     withSource("snap://src/nope"),
			wantMsg: `spec.dataSource: snapshot "nope" of volume "src" does not exist; ` + notYet},
		{name: "a snapshot of another volume",
			obj:     withSource("snap://src/theirs"),
			wantMsg: `spec.dataSource: snapshot "theirs" belongs to volume "other", not "src"; ` + notYet},
		{name: "a snapshot being deleted",
			obj:     withSource("snap://src/going"),
			wantMsg: `spec.dataSource: snapshot "going" of volume "src" is being deleted; ` + notYet},
		{name: "a volume that does not exist",
			obj:     withSource("vol://nope"),
			wantMsg: `spec.dataSource: volume "nope" does not exist; ` + notYet},
		{name: "a volume being deleted",
			obj:     withSource("vol://going-vol"),
			wantMsg: `spec.dataSource: volume "going-vol" is being deleted; ` + notYet},
		{name: "not a data source",
			obj: withSource("http://x"),
			wantMsg: `spec.dataSource: "http://x" is not a data source: expected snap://<volume>/<snapshot> or vol://<volume>; ` +
				notYet},
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
