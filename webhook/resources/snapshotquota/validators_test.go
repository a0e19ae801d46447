package snapshotquota

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/datastore/dstest"
)

func request(apiVersion, kind, name string, spec map[string]any, owners ...metav1.OwnerReference) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": "apps"}, "spec": spec}}
	u.SetOwnerReferences(owners)
	return u
}

func vsOf(claim string, owners ...metav1.OwnerReference) *unstructured.Unstructured {
	return request("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "vs", map[string]any{
		"source": map[string]any{"persistentVolumeClaimName": claim}}, owners...)
}

func vmSource(kind, name string) map[string]any {
	return map[string]any{"source": map[string]any{"apiGroup": "kubevirt.io", "kind": kind, "name": name}}
}

// With a 1Mi namespace quota, already exceeded, every charged request is
// denied; the ones the rules exempt pass.
func TestValidatorsCharge(t *testing.T) {
	backupOwner := metav1.OwnerReference{APIVersion: "harvesterhci.io/v1beta1", Kind: "VirtualMachineBackup", Name: "b", UID: "u"}
	contentOwner := metav1.OwnerReference{APIVersion: "snapshot.kubevirt.io/v1beta1", Kind: "VirtualMachineSnapshotContent", Name: "c", UID: "u"}
	otherOwner := metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Thing", Name: "t", UID: "u"}
	cases := []struct {
		name   string
		obj    *unstructured.Unstructured
		denied bool
	}{
		{name: "VolumeSnapshot of a Strata claim", obj: vsOf("a"), denied: true},
		{name: "VolumeSnapshot with an unrelated owner is charged", obj: vsOf("a", otherOwner), denied: true},
		{name: "VolumeSnapshot of a VM backup: charged at the backup", obj: vsOf("a", backupOwner)},
		{name: "VolumeSnapshot of a VM snapshot's content: charged at the VM snapshot", obj: vsOf("a", contentOwner)},
		{name: "VolumeSnapshot of another driver's or an unknown claim", obj: vsOf("nope")},
		{name: "VolumeSnapshot of an existing content", obj: request("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "vs",
			map[string]any{"source": map[string]any{"volumeSnapshotContentName": "c"}})},
	}
	env := dstest.NewWithVMs(t, []runtime.Object{engine("va", mi), snap("a1", "va", 2*mi), quota("1Mi", nil)},
		claim("a", "va"), vm("vm1", "a"))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := NewVolumeSnapshotValidator(env.DS).Create(nil, tc.obj)
			if tc.denied {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "namespace apps hold 2Mi")
			} else {
				require.NoError(t, err)
			}
		})
	}
	vmCases := []struct {
		name   string
		kind   datastore.OptionalKind
		obj    *unstructured.Unstructured
		denied bool
	}{
		{name: "VM backup", kind: datastore.KindVirtualMachineBackup, denied: true,
			obj: request("harvesterhci.io/v1beta1", "VirtualMachineBackup", "b", vmSource("VirtualMachine", "vm1"))},
		{name: "VM snapshot", kind: datastore.KindVirtualMachineSnapshot, denied: true,
			obj: request("snapshot.kubevirt.io/v1beta1", "VirtualMachineSnapshot", "s", vmSource("VirtualMachine", "vm1"))},
		{name: "a source that is no VM", kind: datastore.KindVirtualMachineSnapshot,
			obj: request("snapshot.kubevirt.io/v1beta1", "VirtualMachineSnapshot", "s", vmSource("Pod", "vm1"))},
	}
	for _, tc := range vmCases {
		t.Run(tc.name, func(t *testing.T) {
			v := newVMRequestValidator(env.DS, tc.kind)
			assert.True(t, v.Installed(), "its CRD is installed")
			err := v.Create(nil, tc.obj)
			if tc.denied {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.kind.Kind+" apps/")
				assert.Contains(t, err.Error(), "would add 1Mi (the live data of volume va)")
			} else {
				require.NoError(t, err)
			}
		})
	}
}

// Without the CRDs the VM-level validators' rules stay out of the
// webhook configuration.
func TestVMValidatorsOnlyWhileInstalled(t *testing.T) {
	env := dstest.New(t, nil, nil)
	assert.False(t, newVMRequestValidator(env.DS, datastore.KindVirtualMachineBackup).Installed())
}

func vgs(source map[string]any) *unstructured.Unstructured {
	return request("groupsnapshot.storage.k8s.io/v1", "VolumeGroupSnapshot", "g", map[string]any{"source": source})
}

// A VolumeGroupSnapshot is charged once for the Strata claims its selector
// picks; the member VolumeSnapshots snapshot-controller makes after the
// cut are not charged again.
func TestVolumeGroupSnapshotCharged(t *testing.T) {
	groupOwner := metav1.OwnerReference{APIVersion: "groupsnapshot.storage.k8s.io/v1", Kind: "VolumeGroupSnapshot", Name: "g", UID: "u"}
	labelled := func(objs []runtime.Object) []runtime.Object {
		objs[1].(*corev1.PersistentVolumeClaim).Labels = map[string]string{"app": "db"}
		return objs
	}
	env := dstest.New(t, []runtime.Object{engine("va", mi), engine("vb", 2*mi), snap("a1", "va", mi), quota("2Mi", nil)},
		append(labelled(claim("a", "va")), labelled(claim("b", "vb"))...))
	cases := []struct {
		name   string
		source map[string]any
		want   string
	}{
		{name: "the selected claims' live data, together", source: map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "db"}}},
			want: "VolumeGroupSnapshot apps/g would add 3Mi (the live data of volumes va, vb)"},
		{name: "a selector that picks nothing", source: map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "web"}}}},
		{name: "from an existing content", source: map[string]any{"volumeGroupSnapshotContentName": "c"}},
	}
	v := NewVolumeGroupSnapshotValidator(env.DS)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := v.Create(nil, vgs(tc.source))
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	assert.Error(t, NewVolumeSnapshotValidator(env.DS).Create(nil, vsOf("b")), "a lone VolumeSnapshot of b is charged")
	assert.NoError(t, NewVolumeSnapshotValidator(env.DS).Create(nil, vsOf("b", groupOwner)), "a group's member is not")
}
