package datastore

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/types"
)

// IndexByNamespace maps a Strata PersistentVolume to the namespace of the
// claim bound to it: the volumes a namespace's quota covers.
const IndexByNamespace = "by-namespace"

// persistentVolumeIndexers find Strata's PVs by volume (the CSI volume
// handle) and by their claim's namespace. Other drivers' PVs are left out.
var persistentVolumeIndexers = cache.Indexers{
	IndexByVolume: indexOn(StrataVolumeHandle),
	IndexByNamespace: indexOn(func(pv *corev1.PersistentVolume) string {
		if StrataVolumeHandle(pv) == "" || pv.Spec.ClaimRef == nil {
			return ""
		}
		return pv.Spec.ClaimRef.Namespace
	}),
}

// StrataVolumeHandle is the Strata volume a PV names, "" for another
// driver's PV.
func StrataVolumeHandle(pv *corev1.PersistentVolume) string {
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != types.CSIDriverName {
		return ""
	}
	return pv.Spec.CSI.VolumeHandle
}

// Claim is a PersistentVolumeClaim by namespace and name.
type Claim struct{ Namespace, Name string }

// ClaimOfVolume is the claim bound to the PV of a Strata volume; ok is false
// for a volume no claim uses (made with kubectl, or its PV released).
func (ds *DataStore) ClaimOfVolume(volume string) (Claim, bool) {
	objs, err := ds.PersistentVolumeInformer.GetIndexer().ByIndex(IndexByVolume, volume)
	if err != nil {
		return Claim{}, false
	}
	for _, obj := range objs {
		if pv := obj.(*corev1.PersistentVolume); pv.Spec.ClaimRef != nil {
			return Claim{Namespace: pv.Spec.ClaimRef.Namespace, Name: pv.Spec.ClaimRef.Name}, true
		}
	}
	return Claim{}, false
}

// VolumeOfClaim is the Strata volume behind a bound claim; ok is false for
// an unbound claim or one of another driver.
func (ds *DataStore) VolumeOfClaim(c Claim) (string, bool) {
	pvc, err := ds.PersistentVolumeClaims.PersistentVolumeClaims(c.Namespace).Get(c.Name)
	if err != nil || pvc.Spec.VolumeName == "" {
		return "", false
	}
	pv, err := ds.PersistentVolumes.Get(pvc.Spec.VolumeName)
	if err != nil || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
		return "", false
	}
	handle := StrataVolumeHandle(pv)
	return handle, handle != ""
}

// VolumesInNamespace lists the Strata volumes bound to claims of a namespace.
func (ds *DataStore) VolumesInNamespace(namespace string) []string {
	objs, _ := ds.PersistentVolumeInformer.GetIndexer().ByIndex(IndexByNamespace, namespace)
	out := make([]string, 0, len(objs))
	for _, obj := range objs {
		out = append(out, StrataVolumeHandle(obj.(*corev1.PersistentVolume)))
	}
	return out
}
