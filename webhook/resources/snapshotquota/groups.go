package snapshotquota

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
)

// VolumeGroupSnapshotResource is groupsnapshot.storage.k8s.io/v1
// volumegroupsnapshots.
var VolumeGroupSnapshotResource = admission.Resource{
	GroupResource: schema.GroupResource{Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshots"},
	Version:       "v1", Kind: "VolumeGroupSnapshot", AnyNamespace: true, CreateOnly: true,
	NewObject: func() runtime.Object { return &unstructured.Unstructured{} },
}

// volumeGroupSnapshotValidator charges a VolumeGroupSnapshot once for every
// Strata claim its selector picks; its member VolumeSnapshots, made after
// the cut, are exempt (chargedAtOwner).
type volumeGroupSnapshotValidator struct {
	ds      *datastore.DataStore
	checker *Checker
}

// NewVolumeGroupSnapshotValidator returns the VolumeGroupSnapshot quota
// check.
func NewVolumeGroupSnapshotValidator(ds *datastore.DataStore) admission.Validator {
	return &volumeGroupSnapshotValidator{ds: ds, checker: NewChecker(ds)}
}

func (v *volumeGroupSnapshotValidator) Resource() admission.Resource {
	return VolumeGroupSnapshotResource
}

// Create charges a group taken from claims (not one bound to an existing
// content). A selector the API server's schema let through but that does
// not parse picks no claim, so there is nothing to charge.
func (v *volumeGroupSnapshotValidator) Create(_ *admission.Request, obj runtime.Object) error {
	vgs := obj.(*unstructured.Unstructured)
	raw, found, _ := unstructured.NestedMap(vgs.Object, "spec", "source", "selector")
	if !found {
		return nil
	}
	var ls metav1.LabelSelector
	if runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &ls) != nil {
		return nil
	}
	selector, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		return nil
	}
	claims, err := v.ds.PersistentVolumeClaims.PersistentVolumeClaims(vgs.GetNamespace()).List(selector)
	if err != nil {
		return err
	}
	var volumes []string
	for _, c := range claims {
		if vol, ok := v.ds.VolumeOfClaim(datastore.Claim{Namespace: c.Namespace, Name: c.Name}); ok {
			volumes = append(volumes, vol)
		}
	}
	if len(volumes) == 0 {
		return nil
	}
	slices.Sort(volumes)
	return v.checker.Check(Charge{What: "VolumeGroupSnapshot " + vgs.GetNamespace() + "/" + vgs.GetName(),
		Namespace: vgs.GetNamespace(), Volumes: volumes})
}

func (v *volumeGroupSnapshotValidator) Update(*admission.Request, runtime.Object, runtime.Object) error {
	return nil
}

// CheckGroup charges a Strata SnapshotGroup a user asks for once per
// namespace its volumes' claims are in: each namespace's quota for its own
// volumes. A volume without a claim counts in no namespace.
func (c *Checker) CheckGroup(g *v1beta1.SnapshotGroup) error {
	byNamespace := map[string][]string{}
	var namespaces []string
	for _, vol := range g.Spec.Volumes {
		claim, ok := c.ds.ClaimOfVolume(vol)
		if !ok {
			continue
		}
		if _, seen := byNamespace[claim.Namespace]; !seen {
			namespaces = append(namespaces, claim.Namespace)
		}
		byNamespace[claim.Namespace] = append(byNamespace[claim.Namespace], vol)
	}
	for _, ns := range namespaces {
		if err := c.Check(Charge{What: "SnapshotGroup " + g.Name, Namespace: ns, Volumes: byNamespace[ns]}); err != nil {
			return err
		}
	}
	return nil
}
