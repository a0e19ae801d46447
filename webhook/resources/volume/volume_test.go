package volume

import (
	"net/http"
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

const ns = admissiontest.Namespace

func node(name string) *v1beta1.Node {
	return &v1beta1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
}

func setting(name types.SettingName, value string) *v1beta1.Setting {
	return &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(name), Namespace: ns}, Value: value}
}

// vol is a valid volume of 1Gi with 2 replicas and at most 250 user
// snapshots (what the mutator fills in); change edits it.
func vol(change func(*v1beta1.Volume)) *v1beta1.Volume {
	v := &v1beta1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: "v1", Namespace: ns},
		Spec: v1beta1.VolumeSpec{Size: resource.MustParse("1Gi"), NumberOfReplicas: 2, Frontend: v1beta1.VolumeFrontendNBD,
			SnapshotMaxCount: 250},
	}
	if change != nil {
		change(v)
	}
	return v
}

func threeNodes() []runtime.Object { return []runtime.Object{node("n1"), node("n2"), node("n3")} }

func TestMutator(t *testing.T) {
	tests := []struct {
		name    string
		objects []runtime.Object
		old     *v1beta1.Volume // nil: create
		obj     *v1beta1.Volume
		// What the patched object holds, and the patch itself.
		wantFinalizers []string
		wantReplicas   int32
		wantFrontend   v1beta1.VolumeFrontend
		wantPatch      string
		wantMsg        string
	}{
		{name: "create adds the finalizer",
			obj:            vol(nil),
			wantFinalizers: []string{types.FinalizerName}, wantReplicas: 2, wantFrontend: "nbd",
			wantPatch: `[{"op":"add","path":"/metadata/finalizers","value":["strata.io/cleanup"]}]`},
		{name: "create keeps other finalizers",
			obj:            vol(func(v *v1beta1.Volume) { v.Finalizers = []string{"other"} }),
			wantFinalizers: []string{"other", types.FinalizerName}, wantReplicas: 2, wantFrontend: "nbd",
			wantPatch: `[{"op":"add","path":"/metadata/finalizers/1","value":"strata.io/cleanup"}]`},
		{name: "create does not add the finalizer twice",
			obj:            vol(func(v *v1beta1.Volume) { v.Finalizers = []string{types.FinalizerName} }),
			wantFinalizers: []string{types.FinalizerName}, wantReplicas: 2, wantFrontend: "nbd"},
		{name: "unset replica count takes the setting",
			objects:        []runtime.Object{setting(types.SettingDefaultReplicaCount, "1")},
			obj:            vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 0; v.Finalizers = []string{types.FinalizerName} }),
			wantFinalizers: []string{types.FinalizerName}, wantReplicas: 1, wantFrontend: "nbd",
			wantPatch: `[{"op":"add","path":"/spec/numberOfReplicas","value":1}]`},
		{name: "unset replica count without a Setting CR takes the setting's default",
			obj:            vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 0 }),
			wantFinalizers: []string{types.FinalizerName}, wantReplicas: 3, wantFrontend: "nbd"},
		{name: "an explicit replica count is kept",
			objects:        []runtime.Object{setting(types.SettingDefaultReplicaCount, "3")},
			obj:            vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 1 }),
			wantFinalizers: []string{types.FinalizerName}, wantReplicas: 1, wantFrontend: "nbd"},
		{name: "an unusable setting denies, naming the field",
			objects: []runtime.Object{setting(types.SettingDefaultReplicaCount, "lots")},
			obj:     vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 0 }),
			wantMsg: `spec.numberOfReplicas: not set, and no default can be taken from the default-replica-count setting: ` +
				`setting default-replica-count: value "lots" is not an integer`},
		{name: "unset frontend becomes nbd",
			obj:            vol(func(v *v1beta1.Volume) { v.Spec.Frontend = ""; v.Finalizers = []string{types.FinalizerName} }),
			wantFinalizers: []string{types.FinalizerName}, wantReplicas: 2, wantFrontend: "nbd",
			wantPatch: `[{"op":"add","path":"/spec/frontend","value":"nbd"}]`},
		{name: "update changes nothing, not even a removed finalizer",
			old:          vol(func(v *v1beta1.Volume) { v.Finalizers = []string{types.FinalizerName} }),
			obj:          vol(func(v *v1beta1.Volume) { v.Spec.Frontend = "" }),
			wantReplicas: 2, wantFrontend: ""},
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
			got := obj.(*v1beta1.Volume)
			assert.Equal(t, tc.wantFinalizers, got.Finalizers)
			assert.Equal(t, tc.wantReplicas, got.Spec.NumberOfReplicas)
			assert.Equal(t, tc.wantFrontend, got.Spec.Frontend)
			assert.True(t, got.Spec.Size.Equal(tc.obj.Spec.Size), "size untouched")
			if tc.wantPatch != "" {
				assert.JSONEq(t, tc.wantPatch, string(resp.Patch))
			}
			if tc.old != nil {
				assert.Empty(t, resp.Patch, "no patch on update")
			}
		})
	}
}

func TestValidatorCreate(t *testing.T) {
	tests := []struct {
		name     string
		objects  []runtime.Object
		user     string
		obj      *v1beta1.Volume
		wantMsg  string
		wantCode int32
	}{
		{name: "valid", obj: vol(nil)},
		{name: "as many replicas as nodes", obj: vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 3 })},
		{name: "more replicas than nodes",
			obj:     vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 4 }),
			wantMsg: "spec.numberOfReplicas: 4 is more than the 3 nodes in the cluster; each replica needs a node of its own"},
		{name: "one node",
			objects: []runtime.Object{node("n1")},
			obj:     vol(nil),
			wantMsg: "spec.numberOfReplicas: 2 is more than the 1 node in the cluster; each replica needs a node of its own"},
		{name: "no replicas",
			obj:     vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 0 }),
			wantMsg: "spec.numberOfReplicas: must be at least 1, got 0"},
		{name: "zero size",
			obj:     vol(func(v *v1beta1.Volume) { v.Spec.Size = resource.MustParse("0") }),
			wantMsg: "spec.size: must be greater than 0, got 0"},
		{name: "negative size and too many replicas: both named",
			obj: vol(func(v *v1beta1.Volume) {
				v.Spec.Size = resource.MustParse("-1Gi")
				v.Spec.NumberOfReplicas = 9
			}),
			wantMsg: "spec.size: must be greater than 0, got -1Gi; " +
				"spec.numberOfReplicas: 9 is more than the 3 nodes in the cluster; each replica needs a node of its own"},
		{name: "nodeID set by an admin",
			obj:      vol(func(v *v1beta1.Volume) { v.Spec.NodeID = "n1" }),
			wantMsg:  "spec.nodeID: written only by the VolumeAttachment controller; add an attachment ticket instead",
			wantCode: http.StatusForbidden},
		{name: "migrationNodeID set by an admin",
			obj:      vol(func(v *v1beta1.Volume) { v.Spec.MigrationNodeID = "n1" }),
			wantMsg:  "spec.migrationNodeID: written only by the VolumeAttachment controller; add an attachment ticket instead",
			wantCode: http.StatusForbidden},
		{name: "nodeID set by the manager", user: admissiontest.Manager,
			obj: vol(func(v *v1beta1.Volume) { v.Spec.NodeID = "n1" })},
		{name: "outside the manager's namespace",
			obj:     vol(func(v *v1beta1.Volume) { v.Namespace = "default" }),
			wantMsg: `metadata.namespace: Volume objects live in namespace strata-system, not "default"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objects := tc.objects
			if objects == nil {
				objects = threeNodes()
			}
			env := dstest.New(t, objects, nil)
			h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
			user := tc.user
			if user == "" {
				user = admissiontest.Admin
			}
			resp := h.Validate(admissiontest.Request(Resource, user, nil, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
			if tc.wantMsg != "" {
				code := tc.wantCode
				if code == 0 {
					code = http.StatusUnprocessableEntity
				}
				assert.Equal(t, code, resp.Result.Code)
				assert.Equal(t, "Volume", resp.Result.Details.Kind)
			}
		})
	}
}

func TestValidatorUpdate(t *testing.T) {
	attached := func(v *v1beta1.Volume) {
		v.Status.State = v1beta1.VolumeStateAttached
		v.Status.CurrentNodeID = "n1"
	}
	tests := []struct {
		name    string
		user    string
		old     *v1beta1.Volume
		obj     *v1beta1.Volume
		wantMsg string
	}{
		{name: "grow", old: vol(nil), obj: vol(func(v *v1beta1.Volume) { v.Spec.Size = resource.MustParse("2Gi") })},
		{name: "same size written differently", old: vol(nil),
			obj: vol(func(v *v1beta1.Volume) { v.Spec.Size = resource.MustParse("1024Mi") })},
		{name: "shrink", old: vol(nil), obj: vol(func(v *v1beta1.Volume) { v.Spec.Size = resource.MustParse("512Mi") }),
			wantMsg: "spec.size: cannot shrink from 1Gi to 512Mi; a volume can only grow"},
		{name: "more replicas than nodes", old: vol(nil), obj: vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 5 }),
			wantMsg: "spec.numberOfReplicas: 5 is more than the 3 nodes in the cluster; each replica needs a node of its own"},
		{name: "a replica count that became too large does not block other updates",
			old: vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 5 }),
			obj: vol(func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 5; v.Finalizers = nil })},
		{name: "data source is immutable",
			old:     vol(func(v *v1beta1.Volume) { v.Spec.DataSource = "vol://a" }),
			obj:     vol(func(v *v1beta1.Volume) { v.Spec.DataSource = "vol://b" }),
			wantMsg: `spec.dataSource: is immutable: cannot change from "vol://a" to "vol://b"`},
		{name: "backing image is immutable",
			old: vol(nil), obj: vol(func(v *v1beta1.Volume) { v.Spec.BackingImage = "bi" }),
			wantMsg: `spec.backingImage: is immutable: cannot change from "" to "bi"`},
		{name: "frontend while detached",
			old: vol(func(v *v1beta1.Volume) { v.Status.State = v1beta1.VolumeStateDetached }),
			obj: vol(func(v *v1beta1.Volume) { v.Spec.Frontend = "" })},
		{name: "frontend while attached",
			old: vol(attached), obj: vol(func(v *v1beta1.Volume) { attached(v); v.Spec.Frontend = "" }),
			wantMsg: `spec.frontend: cannot change from "nbd" to "" while the volume is attached; detach it first`},
		{name: "migratable while attaching",
			old:     vol(func(v *v1beta1.Volume) { v.Status.State = v1beta1.VolumeStateAttaching }),
			obj:     vol(func(v *v1beta1.Volume) { v.Spec.Migratable = true }),
			wantMsg: "spec.migratable: cannot change while the volume is attaching; detach it first"},
		{name: "migratable while detached",
			old: vol(nil), obj: vol(func(v *v1beta1.Volume) { v.Spec.Migratable = true })},
		{name: "an admin sets nodeID",
			old: vol(nil), obj: vol(func(v *v1beta1.Volume) { v.Spec.NodeID = "n2" }),
			wantMsg: "spec.nodeID: written only by the VolumeAttachment controller; add an attachment ticket instead"},
		{name: "an admin clears migrationNodeID",
			old: vol(func(v *v1beta1.Volume) { v.Spec.MigrationNodeID = "n2" }), obj: vol(nil),
			wantMsg: "spec.migrationNodeID: written only by the VolumeAttachment controller; add an attachment ticket instead"},
		{name: "an admin leaves nodeID as it is",
			old: vol(func(v *v1beta1.Volume) { v.Spec.NodeID = "n2" }),
			obj: vol(func(v *v1beta1.Volume) { v.Spec.NodeID = "n2"; v.Spec.Size = resource.MustParse("3Gi") })},
		{name: "the manager sets nodeID and migrationNodeID", user: admissiontest.Manager,
			old: vol(nil), obj: vol(func(v *v1beta1.Volume) { v.Spec.NodeID = "n2"; v.Spec.MigrationNodeID = "n3" })},
	}
	env := dstest.New(t, threeNodes(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			user := tc.user
			if user == "" {
				user = admissiontest.Admin
			}
			resp := h.Validate(admissiontest.Request(Resource, user, tc.old, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}

func TestManagerUsername(t *testing.T) {
	assert.Equal(t, admissiontest.Manager, ManagerUsername(ns))
}
