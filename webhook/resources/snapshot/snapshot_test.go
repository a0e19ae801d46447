package snapshot

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

const ns = admissiontest.Namespace

func volume(name string) *v1beta1.Volume {
	return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: k8stypes.UID("uid-" + name)},
		Spec: v1beta1.VolumeSpec{Size: resource.MustParse("1Gi"), NumberOfReplicas: 1}}
}

// objects: volume v1, and volume dying, which is being deleted.
func objects() []runtime.Object {
	dying := volume("dying")
	dying.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
	dying.Finalizers = []string{types.FinalizerName}
	return []runtime.Object{volume("v1"), dying}
}

// snap is snapshot s1 of volume v1 as a client sends it; change edits it.
func snap(change func(*v1beta1.Snapshot)) *v1beta1.Snapshot {
	s := &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: ns},
		Spec: v1beta1.SnapshotSpec{Volume: "v1", CreateSnapshot: true}}
	if change != nil {
		change(s)
	}
	return s
}

// stored is snap as the mutator left it: labelled, finalized and owned.
func stored(change func(*v1beta1.Snapshot)) *v1beta1.Snapshot {
	return snap(func(s *v1beta1.Snapshot) {
		s.Labels = map[string]string{types.LabelVolume: "v1"}
		s.Finalizers = []string{types.FinalizerName}
		s.OwnerReferences = []metav1.OwnerReference{v1Owner}
		if change != nil {
			change(s)
		}
	})
}

var v1Owner = metav1.OwnerReference{APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: "v1", UID: "uid-v1"}

func TestMutatorCreate(t *testing.T) {
	longName := strings.Repeat("v", 64)
	otherOwner := metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Backup", Name: "b", UID: "uid-b"}
	tests := []struct {
		name           string
		obj            *v1beta1.Snapshot
		wantLabels     map[string]string
		wantFinalizers []string
		wantOwners     []metav1.OwnerReference
		wantNoPatch    bool
	}{
		{name: "label, finalizer and owner by UID",
			obj:            snap(nil),
			wantLabels:     map[string]string{types.LabelVolume: "v1"},
			wantFinalizers: []string{types.FinalizerName},
			wantOwners:     []metav1.OwnerReference{v1Owner}},
		{name: "other labels, finalizers and owners are kept",
			obj: snap(func(s *v1beta1.Snapshot) {
				s.Labels = map[string]string{"team": "a"}
				s.Finalizers = []string{"other"}
				s.OwnerReferences = []metav1.OwnerReference{otherOwner}
			}),
			wantLabels:     map[string]string{"team": "a", types.LabelVolume: "v1"},
			wantFinalizers: []string{"other", types.FinalizerName},
			wantOwners:     []metav1.OwnerReference{otherOwner, v1Owner}},
		{name: "a wrong volume label is corrected",
			obj:            snap(func(s *v1beta1.Snapshot) { s.Labels = map[string]string{types.LabelVolume: "v2"} }),
			wantLabels:     map[string]string{types.LabelVolume: "v1"},
			wantFinalizers: []string{types.FinalizerName},
			wantOwners:     []metav1.OwnerReference{v1Owner}},
		{name: "an owner reference to an earlier volume of the same name is replaced",
			obj: snap(func(s *v1beta1.Snapshot) {
				s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: "v1", UID: "uid-old"}}
			}),
			wantLabels:     map[string]string{types.LabelVolume: "v1"},
			wantFinalizers: []string{types.FinalizerName},
			wantOwners:     []metav1.OwnerReference{v1Owner}},
		{name: "nothing twice: no patch",
			obj:            stored(nil),
			wantLabels:     map[string]string{types.LabelVolume: "v1"},
			wantFinalizers: []string{types.FinalizerName},
			wantOwners:     []metav1.OwnerReference{v1Owner},
			wantNoPatch:    true},
		{name: "a volume not in the cache: label and finalizer, no owner (the validator denies)",
			obj:            snap(func(s *v1beta1.Snapshot) { s.Spec.Volume = "gone" }),
			wantLabels:     map[string]string{types.LabelVolume: "gone"},
			wantFinalizers: []string{types.FinalizerName}},
		{name: "no volume: left to the validator",
			obj:         snap(func(s *v1beta1.Snapshot) { s.Spec.Volume = "" }),
			wantNoPatch: true},
		{name: "a volume name too long for a label value",
			obj:            snap(func(s *v1beta1.Snapshot) { s.Spec.Volume = longName }),
			wantFinalizers: []string{types.FinalizerName}},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, obj := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, nil, tc.obj))
			require.True(t, resp.Allowed, admissiontest.Denial(resp))
			got := obj.(*v1beta1.Snapshot)
			assert.Equal(t, tc.wantLabels, got.Labels)
			assert.Equal(t, tc.wantFinalizers, got.Finalizers)
			assert.Equal(t, tc.wantOwners, got.OwnerReferences)
			for _, ref := range got.OwnerReferences {
				assert.Nil(t, ref.Controller, "the volume is not the controller")
				assert.Nil(t, ref.BlockOwnerDeletion, "the volume's deletion is not blocked by the garbage collector")
			}
			assert.Equal(t, tc.obj.Spec, got.Spec, "spec untouched")
			if tc.wantNoPatch {
				assert.Empty(t, resp.Patch)
			}
		})
	}
}

// The patch applies to what kubectl really sends: no labels, finalizers or
// owner references at all.
func TestMutatorPatch(t *testing.T) {
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
	req := admissiontest.Request(Resource, admissiontest.Admin, nil, snap(nil))
	req.Object.Raw = []byte(`{"apiVersion":"strata.io/v1beta1","kind":"Snapshot",
		"metadata":{"name":"s1","namespace":"strata-system"},
		"spec":{"volume":"v1","createSnapshot":true}}`)
	resp, obj := admissiontest.Mutate(t, h, Resource, req)
	require.True(t, resp.Allowed, admissiontest.Denial(resp))
	assert.JSONEq(t, `[
		{"op":"add","path":"/metadata/finalizers","value":["strata.io/cleanup"]},
		{"op":"add","path":"/metadata/labels","value":{"strata.io/volume":"v1"}},
		{"op":"add","path":"/metadata/ownerReferences","value":[{"apiVersion":"strata.io/v1beta1","kind":"Volume","name":"v1","uid":"uid-v1"}]}]`,
		admissiontest.SortedPatch(t, resp.Patch))
	got := obj.(*v1beta1.Snapshot)
	assert.Equal(t, stored(nil).ObjectMeta, got.ObjectMeta)
}

func TestMutatorUpdateChangesNothing(t *testing.T) {
	deleting := func(s *v1beta1.Snapshot) { s.DeletionTimestamp = &metav1.Time{Time: dstest.Now} }
	tests := []struct {
		name     string
		old, obj *v1beta1.Snapshot
	}{
		{name: "an unlabelled, unowned snapshot stays so",
			old: snap(nil), obj: snap(nil)},
		{name: "a deleting snapshot loses its finalizer",
			old: stored(deleting),
			obj: stored(func(s *v1beta1.Snapshot) { deleting(s); s.Finalizers = nil })},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, _ := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Manager, tc.old, tc.obj))
			require.True(t, resp.Allowed, admissiontest.Denial(resp))
			assert.Empty(t, resp.Patch)
		})
	}
}

func TestValidatorCreate(t *testing.T) {
	tests := []struct {
		name    string
		obj     *v1beta1.Snapshot
		wantMsg string
	}{
		{name: "valid", obj: stored(nil)},
		{name: "valid as kubectl sends it, before the mutator", obj: snap(nil)},
		{name: "a CR for a snapshot the engine took", obj: stored(func(s *v1beta1.Snapshot) { s.Spec.CreateSnapshot = false })},
		{name: "valid labels",
			obj: stored(func(s *v1beta1.Snapshot) {
				s.Spec.Labels = map[string]string{"app": "db", "example.com/tier": "", "RecurringJob": "daily-1"}
			})},
		{name: "the longest name the engine takes",
			obj: stored(func(s *v1beta1.Snapshot) { s.Name = strings.Repeat("s", 63) })},
		{name: "a name too long for the engine",
			obj: stored(func(s *v1beta1.Snapshot) { s.Name = strings.Repeat("s", 64) }),
			wantMsg: `metadata.name: "` + strings.Repeat("s", 64) + `" cannot name a snapshot in the engine: ` +
				`at most 63 characters, letters, digits, '.', '_' and '-', starting with a letter or digit`},
		{name: "a name starting with a dash",
			obj: stored(func(s *v1beta1.Snapshot) { s.Name = "-s1" }),
			wantMsg: `metadata.name: "-s1" cannot name a snapshot in the engine: ` +
				`at most 63 characters, letters, digits, '.', '_' and '-', starting with a letter or digit`},
		{name: "the head's name is reserved",
			obj:     stored(func(s *v1beta1.Snapshot) { s.Name = "volume-head" }),
			wantMsg: `metadata.name: "volume-head" is reserved for the volume's live head layer`},
		{name: "no volume",
			obj:     snap(func(s *v1beta1.Snapshot) { s.Spec.Volume = "" }),
			wantMsg: `spec.volume: required: the name of the volume to snapshot`},
		{name: "an unknown volume",
			obj:     snap(func(s *v1beta1.Snapshot) { s.Spec.Volume = "x" }),
			wantMsg: `spec.volume: volume "x" not found`},
		{name: "a volume being deleted",
			obj: snap(func(s *v1beta1.Snapshot) {
				s.Spec.Volume = "dying"
				s.Labels = map[string]string{types.LabelVolume: "dying"}
			}),
			wantMsg: `spec.volume: volume "dying" is being deleted`},
		{name: "in another namespace",
			obj:     stored(func(s *v1beta1.Snapshot) { s.Namespace = "default" }),
			wantMsg: `metadata.namespace: Snapshot objects live in namespace strata-system, not "default"`},
		{name: "a volume label naming another volume",
			obj:     stored(func(s *v1beta1.Snapshot) { s.Labels[types.LabelVolume] = "v2" }),
			wantMsg: `metadata.labels[strata.io/volume]: "v2" differs from spec.volume "v1"`},
		{name: "an invalid label key",
			obj: stored(func(s *v1beta1.Snapshot) { s.Spec.Labels = map[string]string{"bad key": "x"} }),
			wantMsg: `spec.labels[bad key]: invalid key "bad key": name part must consist of alphanumeric characters, ` +
				`'-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  ` +
				`or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`},
		{name: "an empty label key",
			obj: stored(func(s *v1beta1.Snapshot) { s.Spec.Labels = map[string]string{"": "x"} }),
			wantMsg: `spec.labels[]: invalid key "": name part must be non-empty; name part must consist of alphanumeric ` +
				`characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or ` +
				`'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`},
		{name: "an invalid label value",
			obj: stored(func(s *v1beta1.Snapshot) { s.Spec.Labels = map[string]string{"app": "a b"} }),
			wantMsg: `spec.labels[app]: invalid value "a b": a valid label must be an empty string or consist of ` +
				`alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character ` +
				`(e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is ` +
				`'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')`},
		{name: "every reason at once",
			obj: snap(func(s *v1beta1.Snapshot) {
				s.Name = "volume-head"
				s.Spec.Volume = "x"
				s.Spec.Labels = map[string]string{"app": strings.Repeat("a", 64)}
			}),
			wantMsg: `metadata.name: "volume-head" is reserved for the volume's live head layer; ` +
				`spec.volume: volume "x" not found; ` +
				`spec.labels[app]: invalid value "` + strings.Repeat("a", 64) + `": must be no more than 63 bytes`},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
			if tc.wantMsg != "" {
				assert.EqualValues(t, 422, resp.Result.Code)
			}
		})
	}
}

func TestValidatorUpdate(t *testing.T) {
	deleting := func(s *v1beta1.Snapshot) { s.DeletionTimestamp = &metav1.Time{Time: dstest.Now} }
	withLabels := func(l map[string]string) func(*v1beta1.Snapshot) {
		return func(s *v1beta1.Snapshot) { s.Spec.Labels = l }
	}
	tests := []struct {
		name     string
		old, obj *v1beta1.Snapshot
		wantMsg  string
	}{
		{name: "no change", old: stored(nil), obj: stored(nil)},
		{name: "other metadata may change",
			old: stored(nil),
			obj: stored(func(s *v1beta1.Snapshot) {
				s.Labels["team"] = "a"
				s.Annotations = map[string]string{"note": "x"}
				s.Finalizers = append(s.Finalizers, "other")
			})},
		{name: "a deleting snapshot may lose its finalizer",
			old: stored(deleting),
			obj: stored(func(s *v1beta1.Snapshot) { deleting(s); s.Finalizers = nil })},
		{name: "a deleting snapshot of a volume that is gone may lose its finalizer",
			old: stored(func(s *v1beta1.Snapshot) { deleting(s); s.Spec.Volume = "gone"; s.Labels[types.LabelVolume] = "gone" }),
			obj: stored(func(s *v1beta1.Snapshot) {
				deleting(s)
				s.Spec.Volume = "gone"
				s.Labels[types.LabelVolume] = "gone"
				s.Finalizers = nil
			})},
		{name: "a deleting snapshot's spec is still immutable",
			old:     stored(deleting),
			obj:     stored(func(s *v1beta1.Snapshot) { deleting(s); s.Finalizers = nil; s.Spec.CreateSnapshot = false }),
			wantMsg: `spec.createSnapshot: immutable: cannot change from true to false`},
		{name: "spec.volume is immutable",
			old:     stored(nil),
			obj:     stored(func(s *v1beta1.Snapshot) { s.Spec.Volume = "v2" }),
			wantMsg: `spec.volume: immutable: cannot change from "v1" to "v2"`},
		{name: "spec.createSnapshot is immutable",
			old:     stored(func(s *v1beta1.Snapshot) { s.Spec.CreateSnapshot = false }),
			obj:     stored(nil),
			wantMsg: `spec.createSnapshot: immutable: cannot change from false to true`},
		{name: "empty and missing spec.labels are the same",
			old: stored(withLabels(nil)), obj: stored(withLabels(map[string]string{}))},
		{name: "spec.labels are immutable: changed, removed and added ones are named",
			old: stored(withLabels(map[string]string{"a": "1", "b": "2"})),
			obj: stored(withLabels(map[string]string{"a": "9", "c": "3"})),
			wantMsg: `spec.labels[a]: immutable: cannot change from "1" to "9"; ` +
				`spec.labels[b]: immutable: cannot remove "2"; ` +
				`spec.labels[c]: immutable: cannot add "3"`},
		{name: "the volume label cannot change",
			old:     stored(nil),
			obj:     stored(func(s *v1beta1.Snapshot) { s.Labels[types.LabelVolume] = "v2" }),
			wantMsg: `metadata.labels[strata.io/volume]: immutable: cannot change from "v1" to "v2"`},
		{name: "the volume label cannot be removed",
			old:     stored(nil),
			obj:     stored(func(s *v1beta1.Snapshot) { s.Labels = nil }),
			wantMsg: `metadata.labels[strata.io/volume]: immutable: cannot remove "v1"`},
		{name: "the volume label cannot be emptied",
			old:     stored(nil),
			obj:     stored(func(s *v1beta1.Snapshot) { s.Labels[types.LabelVolume] = "" }),
			wantMsg: `metadata.labels[strata.io/volume]: immutable: cannot change from "v1" to ""`},
		{name: "a missing volume label may be added",
			old: snap(nil),
			obj: stored(nil)},
		{name: "a missing volume label may be added only naming spec.volume",
			old:     snap(nil),
			obj:     snap(func(s *v1beta1.Snapshot) { s.Labels = map[string]string{types.LabelVolume: "v2"} }),
			wantMsg: `metadata.labels[strata.io/volume]: "v2" differs from spec.volume "v1"`},
		{name: "every change named at once",
			old: stored(nil),
			obj: stored(func(s *v1beta1.Snapshot) {
				s.Spec = v1beta1.SnapshotSpec{Volume: "v2", Labels: map[string]string{"a": "1"}}
				delete(s.Labels, types.LabelVolume)
			}),
			wantMsg: `spec.volume: immutable: cannot change from "v1" to "v2"; ` +
				`spec.createSnapshot: immutable: cannot change from true to false; ` +
				`spec.labels[a]: immutable: cannot add "1"; ` +
				`metadata.labels[strata.io/volume]: immutable: cannot remove "v1"`},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Manager, tc.old, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}

// Status writes go to the status subresource, which the webhook never
// judges: the controller's status updates cannot be held up by these rules.
func TestStatusWritesAreNotJudged(t *testing.T) {
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), NewValidator(env.DS))
	req := admissiontest.Request(Resource, admissiontest.Manager, stored(nil),
		stored(func(s *v1beta1.Snapshot) { s.Spec.Volume = "v2"; s.Status.ReadyToUse = true }))
	req.SubResource = "status"
	assert.True(t, h.Validate(req).Allowed)
	resp := h.Mutate(req)
	assert.True(t, resp.Allowed)
	assert.Empty(t, resp.Patch)
}

// What the mutator leaves, the validator accepts.
func TestMutatedSnapshotIsValid(t *testing.T) {
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), NewValidator(env.DS))
	resp, obj := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, nil,
		snap(func(s *v1beta1.Snapshot) { s.Labels = map[string]string{types.LabelVolume: "wrong"} })))
	require.True(t, resp.Allowed, admissiontest.Denial(resp))
	resp = h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, obj))
	assert.True(t, resp.Allowed, admissiontest.Denial(resp))
}

// Owners that make a snapshot one Strata takes for itself (exempt from
// limits and quota) are the manager's to set.
func TestValidatorCreateSystemOwners(t *testing.T) {
	biOwner := metav1.OwnerReference{APIVersion: "strata.io/v1beta1", Kind: "BackingImage", Name: "img", UID: "uid-img"}
	cloneOwner := metav1.OwnerReference{APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: "target", UID: "uid-t"}
	foreign := metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "BackingImage", Name: "img", UID: "uid-x"}
	tests := []struct {
		name, user string
		owner      metav1.OwnerReference
		wantMsg    string
	}{
		{name: "the manager's export snapshot", user: admissiontest.Manager, owner: biOwner},
		{name: "the manager's clone snapshot", user: admissiontest.Manager, owner: cloneOwner},
		{name: "a user's snapshot owned by a backing image", user: admissiontest.Admin, owner: biOwner,
			wantMsg: "metadata.ownerReferences: a snapshot owned by a BackingImage, a Backup or another Volume is one " +
				"Strata takes for itself (exempt from the volume's snapshot limits and the snapshot quota); only " +
				admissiontest.Manager + " creates those"},
		{name: "a user's snapshot owned by another volume", user: admissiontest.Admin, owner: cloneOwner,
			wantMsg: "metadata.ownerReferences: a snapshot owned by a BackingImage"},
		{name: "another group's kind of the same name is no Strata owner", user: admissiontest.Admin, owner: foreign},
	}
	env := dstest.New(t, objects(), nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obj := stored(func(s *v1beta1.Snapshot) { s.OwnerReferences = append(s.OwnerReferences, tc.owner) })
			resp := h.Validate(admissiontest.Request(Resource, tc.user, nil, obj))
			if tc.wantMsg == "" {
				assert.True(t, resp.Allowed, admissiontest.Denial(resp))
				return
			}
			assert.Contains(t, admissiontest.Denial(resp), tc.wantMsg)
			assert.EqualValues(t, 403, resp.Result.Code)
		})
	}
}
