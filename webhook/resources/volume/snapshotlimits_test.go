package volume

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

const mib = int64(1) << 20

// engineOf is volume v1's engine whose chain holds the given snapshots
// (and the head, which counts for nothing).
func engineOf(name string, snaps ...*v1beta1.SnapshotInfo) *v1beta1.Engine {
	e := &v1beta1.Engine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1beta1.EngineSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v1"}},
		Status: v1beta1.EngineStatus{Snapshots: map[string]*v1beta1.SnapshotInfo{
			types.VolumeHeadName: {Name: types.VolumeHeadName, Size: 900 * mib}}}}
	for _, s := range snaps {
		e.Status.Snapshots[s.Name] = s
	}
	return e
}

func userSnap(name string, size int64) *v1beta1.SnapshotInfo {
	return &v1beta1.SnapshotInfo{Name: name, UserCreated: true, Size: size}
}

func TestMutatorSnapshotMaxCount(t *testing.T) {
	unset := func(v *v1beta1.Volume) { v.Spec.SnapshotMaxCount = 0; v.Finalizers = []string{types.FinalizerName} }
	tests := []struct {
		name      string
		objects   []runtime.Object
		old       *v1beta1.Volume // nil: create
		obj       *v1beta1.Volume
		wantCount int32
		wantPatch string
		wantMsg   string
	}{
		{name: "unset on create takes the setting",
			objects: []runtime.Object{setting(types.SettingSnapshotMaxCount, "10")}, obj: vol(unset), wantCount: 10,
			wantPatch: `[{"op":"add","path":"/spec/snapshotMaxCount","value":10}]`},
		{name: "unset on create without a Setting CR takes the setting's default",
			obj: vol(unset), wantCount: 250},
		{name: "set on create is kept",
			objects: []runtime.Object{setting(types.SettingSnapshotMaxCount, "10")},
			obj:     vol(func(v *v1beta1.Volume) { v.Spec.SnapshotMaxCount = 5 }), wantCount: 5},
		{name: "an unusable setting denies, naming the field",
			objects: []runtime.Object{setting(types.SettingSnapshotMaxCount, "1")}, obj: vol(unset),
			wantMsg: "spec.snapshotMaxCount: not set, and no default can be taken from the snapshot-max-count setting: " +
				"setting snapshot-max-count: value 1 is outside [2, 250]"},
		{name: "a 0 stored before the default existed is left on update",
			objects: []runtime.Object{setting(types.SettingSnapshotMaxCount, "10")},
			old:     vol(unset), obj: vol(func(v *v1beta1.Volume) { unset(v); v.Spec.Size = resource.MustParse("2Gi") }),
			wantCount: 0},
		{name: "cleared by an update: the setting again, as on create",
			objects: []runtime.Object{setting(types.SettingSnapshotMaxCount, "10")},
			old:     vol(func(v *v1beta1.Volume) { v.Spec.SnapshotMaxCount = 5 }), obj: vol(unset), wantCount: 10,
			wantPatch: `[{"op":"add","path":"/spec/snapshotMaxCount","value":10}]`},
		{name: "changed by an update: kept",
			old: vol(nil), obj: vol(func(v *v1beta1.Volume) { v.Spec.SnapshotMaxCount = 7 }), wantCount: 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, tc.objects, nil)
			h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
			var old runtime.Object
			if tc.old != nil {
				old = tc.old
			}
			resp, obj := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, old, tc.obj))
			if tc.wantMsg != "" {
				assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
				return
			}
			require.True(t, resp.Allowed, admissiontest.Denial(resp))
			assert.Equal(t, tc.wantCount, obj.(*v1beta1.Volume).Spec.SnapshotMaxCount)
			if tc.wantPatch != "" {
				assert.JSONEq(t, tc.wantPatch, string(resp.Patch))
			}
		})
	}
}

func TestValidatorSnapshotLimitsOnCreate(t *testing.T) {
	withLimits := func(count int32, size string) *v1beta1.Volume {
		return vol(func(v *v1beta1.Volume) {
			v.Spec.SnapshotMaxCount = count
			if size != "" {
				v.Spec.SnapshotMaxSize = resource.MustParse(size)
			}
		})
	}
	tests := []struct {
		name    string
		obj     *v1beta1.Volume
		wantMsg string
	}{
		{name: "the lowest count", obj: withLimits(2, "")},
		{name: "the highest count", obj: withLimits(250, "")},
		{name: "0: the setting applies (what the mutator fills in is judged)", obj: withLimits(0, "")},
		{name: "a count of 1", obj: withLimits(1, ""), wantMsg: "spec.snapshotMaxCount: must be between 2 and 250, got 1"},
		{name: "a count over 250", obj: withLimits(251, ""), wantMsg: "spec.snapshotMaxCount: must be between 2 and 250, got 251"},
		{name: "no size limit", obj: withLimits(5, "0")},
		{name: "twice the size", obj: withLimits(5, "2Gi")},
		{name: "twice the size written in another unit", obj: withLimits(5, "2048Mi")},
		{name: "less than twice the size", obj: withLimits(5, "1Gi"),
			wantMsg: "spec.snapshotMaxSize: 1Gi is less than twice spec.size 1Gi; set at least 2Gi, or 0 for no limit"},
		{name: "a byte short of twice the size", obj: withLimits(5, "2147483647"),
			wantMsg: "spec.snapshotMaxSize: 2147483647 is less than twice spec.size 1Gi; set at least 2Gi, or 0 for no limit"},
		{name: "negative", obj: withLimits(5, "-1Gi"), wantMsg: "spec.snapshotMaxSize: must not be negative, got -1Gi"},
		{name: "both wrong: both named", obj: withLimits(300, "1Mi"),
			wantMsg: "spec.snapshotMaxCount: must be between 2 and 250, got 300; " +
				"spec.snapshotMaxSize: 1Mi is less than twice spec.size 1Gi; set at least 2Gi, or 0 for no limit"},
	}
	env := dstest.New(t, threeNodes(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}

// TestValidatorSnapshotLimitsOnUpdate: a lowered limit is judged against
// what the engine's chain holds (from the cache), and a grown volume
// against its size limit.
func TestValidatorSnapshotLimitsOnUpdate(t *testing.T) {
	limits := func(count int32, size string) func(*v1beta1.Volume) {
		return func(v *v1beta1.Volume) {
			v.Spec.SnapshotMaxCount = count
			v.Spec.SnapshotMaxSize = resource.MustParse(size)
		}
	}
	// Three user snapshots, one removed user snapshot and a rebuild's
	// system snapshot: 3 count, and all five layers' 2.5Gi of data.
	chain := engineOf("v1-e-0", userSnap("s1", 512*mib), userSnap("s2", 512*mib), userSnap("s3", 512*mib),
		&v1beta1.SnapshotInfo{Name: "s0", UserCreated: true, Removed: true, Size: 512 * mib},
		&v1beta1.SnapshotInfo{Name: "rebuild-1", Size: 512 * mib})
	tests := []struct {
		name     string
		engines  []runtime.Object
		old, obj func(*v1beta1.Volume)
		wantMsg  string
	}{
		{name: "count lowered to what the volume holds", engines: []runtime.Object{chain},
			old: limits(10, "0"), obj: limits(3, "0")},
		{name: "count lowered below what the volume holds: denied with the figure", engines: []runtime.Object{chain},
			old: limits(10, "0"), obj: limits(2, "0"),
			wantMsg: "spec.snapshotMaxCount: cannot lower to 2: the volume holds 3 user snapshots; delete 1 of them first"},
		{name: "count set on a volume that meant the setting: judged as a lowering", engines: []runtime.Object{chain},
			old: limits(0, "0"), obj: limits(2, "0"),
			wantMsg: "spec.snapshotMaxCount: cannot lower to 2: the volume holds 3 user snapshots; delete 1 of them first"},
		{name: "count raised, though still below what the volume holds: allowed, it helps",
			engines: []runtime.Object{chain}, old: limits(2, "0"), obj: limits(3, "0")},
		{name: "count lowered on a volume never attached (no chain yet)", old: limits(10, "0"), obj: limits(2, "0")},
		{name: "count out of bounds", old: limits(10, "0"), obj: limits(251, "0"),
			wantMsg: "spec.snapshotMaxCount: must be between 2 and 250, got 251"},
		{name: "size limit lowered to what the snapshots hold", engines: []runtime.Object{chain},
			old: limits(10, "4Gi"), obj: limits(10, "2560Mi")},
		{name: "size limit lowered below what the snapshots hold: denied with the figure", engines: []runtime.Object{chain},
			old: limits(10, "4Gi"), obj: limits(10, "2Gi"),
			wantMsg: "spec.snapshotMaxSize: cannot lower to 2Gi: the volume's snapshots hold 2.5Gi (2684354560 bytes; " +
				"removed ones count until purged); delete snapshots first"},
		{name: "size limit set where there was none, below what the snapshots hold", engines: []runtime.Object{chain},
			old: limits(10, "0"), obj: limits(10, "2Gi"),
			wantMsg: "spec.snapshotMaxSize: cannot lower to 2Gi: the volume's snapshots hold 2.5Gi (2684354560 bytes; " +
				"removed ones count until purged); delete snapshots first"},
		{name: "size limit removed", engines: []runtime.Object{chain}, old: limits(10, "4Gi"), obj: limits(10, "0")},
		{name: "the larger of two engines' reports counts (a migration)",
			engines: []runtime.Object{engineOf("v1-e-1", userSnap("s1", mib)), chain},
			old:     limits(10, "0"), obj: limits(2, "0"),
			wantMsg: "spec.snapshotMaxCount: cannot lower to 2: the volume holds 3 user snapshots; delete 1 of them first"},
		{name: "the volume grows past half its size limit: denied, naming the limit",
			old: limits(10, "2Gi"), obj: func(v *v1beta1.Volume) { limits(10, "2Gi")(v); v.Spec.Size = resource.MustParse("2Gi") },
			wantMsg: "spec.snapshotMaxSize: 2Gi is less than twice spec.size 2Gi; set at least 4Gi, or 0 for no limit"},
		{name: "the volume grows with its size limit", old: limits(10, "2Gi"),
			obj: func(v *v1beta1.Volume) { limits(10, "4Gi")(v); v.Spec.Size = resource.MustParse("2Gi") }},
		{name: "limits unchanged: not judged again (a volume that became invalid can still be updated)",
			engines: []runtime.Object{chain}, old: limits(2, "1Gi"),
			obj: func(v *v1beta1.Volume) { limits(2, "1Gi")(v); v.Spec.NumberOfReplicas = 3 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, append(threeNodes(), tc.engines...), nil)
			h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, vol(tc.old), vol(tc.obj)))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}
