package snapshotquota

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/webhook/admission"
)

// VolumeSnapshotResource is snapshot.storage.k8s.io/v1 volumesnapshots.
var VolumeSnapshotResource = admission.Resource{
	GroupResource: schema.GroupResource{Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots"},
	Version:       "v1", Kind: "VolumeSnapshot", AnyNamespace: true, CreateOnly: true,
	NewObject: func() runtime.Object { return &unstructured.Unstructured{} },
}

// volumeSnapshotValidator charges a VolumeSnapshot of a Strata claim.
type volumeSnapshotValidator struct {
	ds      *datastore.DataStore
	checker *Checker
}

// NewVolumeSnapshotValidator returns the VolumeSnapshot quota check.
func NewVolumeSnapshotValidator(ds *datastore.DataStore) admission.Validator {
	return &volumeSnapshotValidator{ds: ds, checker: NewChecker(ds)}
}

func (v *volumeSnapshotValidator) Resource() admission.Resource { return VolumeSnapshotResource }

// Create checks a snapshot of a claim (not one taken from an existing
// content) unless a VM-level request or a group made it: that request was
// charged for all of its volumes already (the seed's owner-reference rule).
func (v *volumeSnapshotValidator) Create(_ *admission.Request, obj runtime.Object) error {
	vs := obj.(*unstructured.Unstructured)
	claim, _, _ := unstructured.NestedString(vs.Object, "spec", "source", "persistentVolumeClaimName")
	if claim == "" || chargedAtOwner(vs) {
		return nil
	}
	volume, ok := v.ds.VolumeOfClaim(datastore.Claim{Namespace: vs.GetNamespace(), Name: claim})
	if !ok {
		return nil // another driver's claim, or one not bound: nothing of Strata's to snapshot
	}
	return v.checker.Check(Charge{What: "VolumeSnapshot " + vs.GetNamespace() + "/" + vs.GetName(),
		Namespace: vs.GetNamespace(), Volumes: []string{volume}})
}

func (v *volumeSnapshotValidator) Update(*admission.Request, runtime.Object, runtime.Object) error {
	return nil
}

// chargingOwners are the kinds whose VolumeSnapshots were charged at the
// request that made them: Harvester's backups, KubeVirt's snapshots
// (KubeVirt owns them by the snapshot's content), and VolumeGroupSnapshots,
// whose members snapshot-controller makes after the cut.
var chargingOwners = map[string]bool{
	"harvesterhci.io/VirtualMachineBackup":               true,
	"snapshot.kubevirt.io/VirtualMachineSnapshot":        true,
	"snapshot.kubevirt.io/VirtualMachineSnapshotContent": true,
	"groupsnapshot.storage.k8s.io/VolumeGroupSnapshot":   true,
}

func chargedAtOwner(vs *unstructured.Unstructured) bool {
	for _, ref := range vs.GetOwnerReferences() {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err == nil && chargingOwners[gv.Group+"/"+ref.Kind] {
			return true
		}
	}
	return false
}

// vmRequestValidator charges a VM-level request — a KubeVirt
// VirtualMachineSnapshot or a Harvester VirtualMachineBackup — for every
// Strata volume of its VM. Its rule exists only while the kind does.
type vmRequestValidator struct {
	ds       *datastore.DataStore
	kind     datastore.OptionalKind
	resource admission.Resource
	checker  *Checker
}

// NewVMSnapshotValidator returns the VirtualMachineSnapshot quota check.
func NewVMSnapshotValidator(ds *datastore.DataStore) admission.Validator {
	return newVMRequestValidator(ds, datastore.KindVirtualMachineSnapshot)
}

// NewVMBackupValidator returns the VirtualMachineBackup quota check.
func NewVMBackupValidator(ds *datastore.DataStore) admission.Validator {
	return newVMRequestValidator(ds, datastore.KindVirtualMachineBackup)
}

func newVMRequestValidator(ds *datastore.DataStore, kind datastore.OptionalKind) *vmRequestValidator {
	return &vmRequestValidator{ds: ds, kind: kind, checker: NewChecker(ds), resource: admission.Resource{
		GroupResource: kind.GroupResource(),
		// Any served version: the fields read are the same in all of them.
		Version: "*", Kind: kind.Kind, AnyNamespace: true, CreateOnly: true,
		NewObject: func() runtime.Object { return &unstructured.Unstructured{} },
	}}
}

func (v *vmRequestValidator) Resource() admission.Resource { return v.resource }

func (v *vmRequestValidator) Installed() bool { return v.ds.OptionalKinds.Installed(v.kind) }

// Create charges the VM named by spec.source (kind VirtualMachine).
func (v *vmRequestValidator) Create(_ *admission.Request, obj runtime.Object) error {
	req := obj.(*unstructured.Unstructured)
	kind, _, _ := unstructured.NestedString(req.Object, "spec", "source", "kind")
	name, _, _ := unstructured.NestedString(req.Object, "spec", "source", "name")
	if kind != datastore.KindVirtualMachine.Kind || name == "" {
		return nil
	}
	var volumes []string
	if vm, ok := v.ds.OptionalKinds.VirtualMachine(req.GetNamespace(), name); ok {
		volumes = v.ds.VirtualMachineVolumes(vm)
	}
	return v.checker.Check(Charge{What: v.kind.Kind + " " + req.GetNamespace() + "/" + req.GetName(),
		Namespace: req.GetNamespace(), Volumes: volumes, VM: name})
}

func (v *vmRequestValidator) Update(*admission.Request, runtime.Object, runtime.Object) error {
	return nil
}
