package volume

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

var (
	specPath          = field.NewPath("spec")
	sizePath          = specPath.Child("size")
	replicasPath      = specPath.Child("numberOfReplicas")
	frontendPath      = specPath.Child("frontend")
	dataSourcePath    = specPath.Child("dataSource")
	backingImagePath  = specPath.Child("backingImage")
	migratablePath    = specPath.Child("migratable")
	nodeIDPath        = specPath.Child("nodeID")
	migrationNodePath = specPath.Child("migrationNodeID")
)

type validator struct {
	ds *datastore.DataStore
	// manager is the username of the manager ServiceAccount, the only
	// writer of spec.nodeID and spec.migrationNodeID.
	manager string
}

// NewValidator returns the Volume validator, which judges deletions too.
func NewValidator(ds *datastore.DataStore) admission.DeleteValidator {
	return &validator{ds: ds, manager: ManagerUsername(ds.Namespace)}
}

// ManagerUsername is how the API server names the manager ServiceAccount.
func ManagerUsername(namespace string) string {
	return "system:serviceaccount:" + namespace + ":" + types.ManagerServiceAccount
}

func (v *validator) Resource() admission.Resource { return Resource }

func (v *validator) Create(req *admission.Request, obj runtime.Object) error {
	vol := obj.(*v1beta1.Volume)
	var errs admission.FieldErrors
	errs.Add(validSize(vol), v.validReplicas(vol.Spec.NumberOfReplicas), validSnapshotMaxCount(vol), validSnapshotMaxSize(vol))
	if vol.Spec.DataSource != "" {
		errs.Add(v.validDataSource(vol))
	}
	if vol.Spec.FromBackup != "" {
		errs.Add(v.validFromBackup(vol))
	}
	if vol.Spec.BackingImage != "" {
		errs.Add(v.existingBackingImage(vol))
	}
	if req.Username() != v.manager {
		if vol.Spec.NodeID != "" {
			errs.Add(attachmentFieldForbidden(nodeIDPath))
		}
		if vol.Spec.MigrationNodeID != "" {
			errs.Add(attachmentFieldForbidden(migrationNodePath))
		}
	}
	return errs.Err()
}

// Update checks only what changed, so that a volume which became invalid
// (a node left the cluster) can still be updated, and deleted.
func (v *validator) Update(req *admission.Request, oldObj, newObj runtime.Object) error {
	old, vol := oldObj.(*v1beta1.Volume), newObj.(*v1beta1.Volume)
	var errs admission.FieldErrors
	if vol.Spec.Size.Cmp(old.Spec.Size) != 0 {
		errs.Add(validSize(vol))
		if vol.Spec.Size.Cmp(old.Spec.Size) < 0 {
			errs.Add(admission.Invalid(sizePath, "cannot shrink from %s to %s; a volume can only grow",
				old.Spec.Size.String(), vol.Spec.Size.String()))
		}
	}
	if vol.Spec.NumberOfReplicas != old.Spec.NumberOfReplicas {
		errs.Add(v.validReplicas(vol.Spec.NumberOfReplicas))
	}
	errs.Add(v.snapshotLimitChanges(old, vol)...)
	errs.Add(immutable(dataSourcePath, old.Spec.DataSource, vol.Spec.DataSource))
	errs.Add(immutable(fromBackupPath, old.Spec.FromBackup, vol.Spec.FromBackup))
	errs.Add(immutable(backingImagePath, old.Spec.BackingImage, vol.Spec.BackingImage))
	if state, attached := isAttached(old); attached {
		if vol.Spec.Frontend != old.Spec.Frontend {
			errs.Add(admission.Invalid(frontendPath, "cannot change from %q to %q while the volume is %s; detach it first",
				old.Spec.Frontend, vol.Spec.Frontend, state))
		}
		if vol.Spec.Migratable != old.Spec.Migratable {
			errs.Add(admission.Invalid(migratablePath, "cannot change while the volume is %s; detach it first", state))
		}
	}
	if req.Username() != v.manager {
		if vol.Spec.NodeID != old.Spec.NodeID {
			errs.Add(attachmentFieldForbidden(nodeIDPath))
		}
		if vol.Spec.MigrationNodeID != old.Spec.MigrationNodeID {
			errs.Add(attachmentFieldForbidden(migrationNodePath))
		}
	}
	return errs.Err()
}

// existingBackingImage refuses a volume built on an image that is not there
// (or going): its replicas would wait for it forever.
// A volume smaller than the image's data could not hold it.
func (v *validator) existingBackingImage(vol *v1beta1.Volume) *admission.FieldError {
	name := vol.Spec.BackingImage
	bi, err := v.ds.BackingImages.GetROOrLive(context.Background(), name)
	switch {
	case apierrors.IsNotFound(err):
		return admission.Invalid(backingImagePath, "backing image %q not found; create it first", name)
	case err != nil:
		return admission.Invalid(backingImagePath, "cannot look up backing image %q: %v", name, err)
	case bi.DeletionTimestamp != nil:
		return admission.Invalid(backingImagePath, "backing image %q is being deleted", name)
	case bi.Status.VirtualSize > vol.Spec.Size.Value():
		return admission.Invalid(sizePath, "%s is smaller than backing image %s's virtual size (%d bytes)",
			vol.Spec.Size.String(), name, bi.Status.VirtualSize)
	}
	return nil
}

func validSize(vol *v1beta1.Volume) *admission.FieldError {
	if vol.Spec.Size.Sign() <= 0 {
		return admission.Invalid(sizePath, "must be greater than 0, got %s", vol.Spec.Size.String())
	}
	return nil
}

// validReplicas: every replica needs a node of its own.
func (v *validator) validReplicas(n int32) *admission.FieldError {
	if n < 1 {
		return admission.Invalid(replicasPath, "must be at least 1, got %d", n)
	}
	nodes, err := v.ds.Nodes.ListRO(nil)
	if err != nil {
		return admission.Invalid(replicasPath, "cannot count the nodes: %v", err)
	}
	if int(n) > len(nodes) {
		return admission.Invalid(replicasPath, "%d is more than the %s in the cluster; each replica needs a node of its own",
			n, plural(len(nodes), "node"))
	}
	return nil
}

func immutable(path *field.Path, old, cur string) *admission.FieldError {
	if old == cur {
		return nil
	}
	return admission.Invalid(path, "is immutable: cannot change from %q to %q", old, cur)
}

func attachmentFieldForbidden(path *field.Path) *admission.FieldError {
	return admission.Forbidden(path, "written only by the VolumeAttachment controller; add an attachment ticket instead")
}

// isAttached tells a volume that is attached or on its way in or out, when
// its frontend and migratability are in use.
func isAttached(vol *v1beta1.Volume) (v1beta1.VolumeState, bool) {
	switch vol.Status.State {
	case v1beta1.VolumeStateAttaching, v1beta1.VolumeStateAttached, v1beta1.VolumeStateDetaching:
		return vol.Status.State, true
	}
	if vol.Status.CurrentNodeID != "" {
		return "attached to " + v1beta1.VolumeState(vol.Status.CurrentNodeID), true
	}
	return vol.Status.State, false
}

func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
