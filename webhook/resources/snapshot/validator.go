package snapshot

import (
	"context"
	"maps"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
	"github.com/strata-storage/strata/webhook/resources/snapshotquota"
)

var (
	namePath           = field.NewPath("metadata", "name")
	volumeLabelPath    = field.NewPath("metadata", "labels").Key(types.LabelVolume)
	specPath           = field.NewPath("spec")
	volumePath         = specPath.Child("volume")
	createSnapshotPath = specPath.Child("createSnapshot")
	labelsPath         = specPath.Child("labels")
	ownersPath         = field.NewPath("metadata", "ownerReferences")
)

type validator struct {
	ds      *datastore.DataStore
	quota   *snapshotquota.Checker
	manager string // the manager ServiceAccount's username
}

// NewValidator returns the Snapshot validator.
func NewValidator(ds *datastore.DataStore) admission.Validator {
	return &validator{ds: ds, quota: snapshotquota.NewChecker(ds),
		manager: serviceaccount.MakeUsername(ds.Namespace, types.ManagerServiceAccount)}
}

func (v *validator) Resource() admission.Resource { return Resource }

// Create: the CR's name is the snapshot's name in the engine, so it must be
// one the replicas accept; the volume must exist and not be on its way out;
// the labels go to the engine and must be valid Kubernetes labels.
func (v *validator) Create(req *admission.Request, obj runtime.Object) error {
	snap := obj.(*v1beta1.Snapshot)
	var errs admission.FieldErrors
	errs.Add(validName(snap.Name), validVolume(v.ds, volumePath, snap.Spec.Volume))
	if got, ok := snap.Labels[types.LabelVolume]; ok && snap.Spec.Volume != "" && got != snap.Spec.Volume {
		errs.Add(admission.Invalid(volumeLabelPath, "%q differs from spec.volume %q", got, snap.Spec.Volume))
	}
	errs.Add(validLabels(snap.Spec.Labels)...)
	if snap.TakenForStrata() && req != nil && req.Username() != v.manager {
		errs.Add(admission.Forbidden(ownersPath, "a snapshot owned by a BackingImage, a Backup or another Volume "+
			"is one Strata takes for itself (exempt from the volume's snapshot limits and the snapshot quota); "+
			"only %s creates those", v.manager))
	}
	if len(errs) > 0 {
		return errs.Err()
	}
	return v.checkQuota(snap)
}

// checkQuota charges a snapshot a user asks for against the snapshot quota
// of the namespace whose claim the volume serves. Exempt: a snapshot that
// records one the engine already has (createSnapshot false), one the CSI
// driver makes for a VolumeSnapshot (charged there), and one Strata takes
// for another object — a clone, a backing image export, a backup — which
// owns it.
func (v *validator) checkQuota(snap *v1beta1.Snapshot) error {
	if !snap.Spec.CreateSnapshot || snap.Annotations[types.AnnotationCSIName] != "" || snap.TakenForStrata() {
		return nil
	}
	claim, ok := v.ds.ClaimOfVolume(snap.Spec.Volume)
	if !ok {
		return nil // no claim, no namespace quota
	}
	return v.quota.Check(snapshotquota.Charge{What: "Snapshot " + snap.Name, Namespace: claim.Namespace,
		Volumes: []string{snap.Spec.Volume}})
}

// Update: the spec is immutable (seed snapshot-crd, "Update"), and so is the
// volume label once set. Nothing else is judged, so that a snapshot being
// deleted can always lose its finalizer.
func (v *validator) Update(_ *admission.Request, oldObj, newObj runtime.Object) error {
	old, snap := oldObj.(*v1beta1.Snapshot), newObj.(*v1beta1.Snapshot)
	var errs admission.FieldErrors
	if snap.Spec.Volume != old.Spec.Volume {
		errs.Add(admission.Invalid(volumePath, "immutable: cannot change from %q to %q", old.Spec.Volume, snap.Spec.Volume))
	}
	if snap.Spec.CreateSnapshot != old.Spec.CreateSnapshot {
		errs.Add(admission.Invalid(createSnapshotPath, "immutable: cannot change from %t to %t",
			old.Spec.CreateSnapshot, snap.Spec.CreateSnapshot))
	}
	errs.Add(immutableLabels(old.Spec.Labels, snap.Spec.Labels)...)
	errs.Add(immutableVolumeLabel(old, snap))
	return errs.Err()
}

// validName applies the data plane's rule (types.ValidateSnapshotName): the
// name becomes part of the replicas' file names.
func validName(name string) *admission.FieldError {
	if name == types.VolumeHeadName {
		return admission.Invalid(namePath, "%q is reserved for the volume's live head layer", name)
	}
	if err := types.ValidateSnapshotName(name); err != nil {
		return admission.Invalid(namePath, "%q cannot name a snapshot in the engine: at most 63 characters, "+
			"letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// validVolume: a volume to snapshot, named at path, exists and is not on
// its way out.
func validVolume(ds *datastore.DataStore, path *field.Path, name string) *admission.FieldError {
	if name == "" {
		return admission.Invalid(path, "required: the name of the volume to snapshot")
	}
	vol, err := ds.Volumes.GetROOrLive(context.Background(), name)
	if apierrors.IsNotFound(err) {
		return admission.Invalid(path, "volume %q not found", name)
	} else if err != nil {
		return admission.Invalid(path, "cannot look up volume %q: %v", name, err)
	}
	if vol.DeletionTimestamp != nil {
		return admission.Invalid(path, "volume %q is being deleted", name)
	}
	return nil
}

// validLabels: the engine stores the labels with the snapshot; they follow
// the rules of Kubernetes labels.
func validLabels(labels map[string]string) []*admission.FieldError {
	return admission.LabelErrors(labelsPath, labels)
}

// immutableLabels names every label added, removed or changed; an empty and
// a missing map are the same.
func immutableLabels(old, cur map[string]string) []*admission.FieldError {
	keys := slices.Collect(maps.Keys(old))
	for k := range cur {
		if _, ok := old[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var errs []*admission.FieldError
	for _, k := range keys {
		was, had := old[k]
		is, has := cur[k]
		switch {
		case had && has && was != is:
			errs = append(errs, admission.Invalid(labelsPath.Key(k), "immutable: cannot change from %q to %q", was, is))
		case had && !has:
			errs = append(errs, admission.Invalid(labelsPath.Key(k), "immutable: cannot remove %q", was))
		case !had && has:
			errs = append(errs, admission.Invalid(labelsPath.Key(k), "immutable: cannot add %q", is))
		}
	}
	return errs
}

// immutableVolumeLabel: the volume label may be added later (a snapshot
// created while the webhook was away), but only naming spec.volume, and
// once set it stays.
func immutableVolumeLabel(old, snap *v1beta1.Snapshot) *admission.FieldError {
	was, had := old.Labels[types.LabelVolume]
	is, has := snap.Labels[types.LabelVolume]
	switch {
	case had && !has:
		return admission.Invalid(volumeLabelPath, "immutable: cannot remove %q", was)
	case had && was != is:
		return admission.Invalid(volumeLabelPath, "immutable: cannot change from %q to %q", was, is)
	case !had && has && is != snap.Spec.Volume:
		return admission.Invalid(volumeLabelPath, "%q differs from spec.volume %q", is, snap.Spec.Volume)
	}
	return nil
}
