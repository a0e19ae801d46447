package snapshot

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
	"github.com/strata-storage/strata/webhook/resources/snapshotquota"
)

// GroupResource is strata.io/v1beta1 snapshotgroups.
var GroupResource = admission.Resource{
	GroupResource: v1beta1.Resource("snapshotgroups"),
	Version:       v1beta1.SchemeGroupVersion.Version,
	Kind:          "SnapshotGroup",
	CreateOnly:    true, // the spec is immutable (the CRD's rules)
	NewObject:     func() runtime.Object { return &v1beta1.SnapshotGroup{} },
}

var (
	groupVolumesPath = specPath.Child("volumes")
	csiNamePath      = field.NewPath("metadata", "annotations").Key(types.AnnotationCSIName)
)

type groupValidator struct {
	ds    *datastore.DataStore
	quota *snapshotquota.Checker
	csi   string // the CSI controller ServiceAccount's username
}

// NewGroupValidator returns the SnapshotGroup validator.
func NewGroupValidator(ds *datastore.DataStore) admission.Validator {
	return &groupValidator{ds: ds, quota: snapshotquota.NewChecker(ds),
		csi: serviceaccount.MakeUsername(ds.Namespace, types.CSIControllerServiceAccount)}
}

func (v *groupValidator) Resource() admission.Resource { return GroupResource }

// Create: every volume exists and stays, the labels are valid, and the
// group is charged once against the snapshot quota of its claims'
// namespaces. A group the CSI driver makes for a VolumeGroupSnapshot was
// charged there; only the CSI controller may say a group is one of those.
func (v *groupValidator) Create(req *admission.Request, obj runtime.Object) error {
	g := obj.(*v1beta1.SnapshotGroup)
	var errs admission.FieldErrors
	for i, vol := range g.Spec.Volumes {
		errs.Add(validVolume(v.ds, groupVolumesPath.Index(i), vol))
	}
	errs.Add(admission.LabelErrors(specPath.Child("labels"), g.Spec.Labels)...)
	madeByCSI := g.Annotations[types.AnnotationCSIName] != ""
	if madeByCSI && req != nil && req.Username() != v.csi {
		errs.Add(admission.Forbidden(csiNamePath, "marks a group the CSI driver makes for a VolumeGroupSnapshot "+
			"(charged to the snapshot quota there); only %s sets it", v.csi))
	}
	if len(errs) > 0 {
		return errs.Err()
	}
	if madeByCSI {
		return nil
	}
	return v.quota.CheckGroup(g)
}

func (v *groupValidator) Update(*admission.Request, runtime.Object, runtime.Object) error { return nil }
