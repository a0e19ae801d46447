package volumeattachment

import (
	"context"
	"maps"
	"reflect"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
)

var (
	volumePath  = field.NewPath("spec", "volume")
	ticketsPath = field.NewPath("spec", "attachmentTickets")
	namePath    = field.NewPath("metadata", "name")
)

// knownAttacherTypes are the AttacherType constants of the API.
var knownAttacherTypes = []v1beta1.AttacherType{
	v1beta1.AttacherTypeCSIAttacher, v1beta1.AttacherTypeStrataAPI, v1beta1.AttacherTypeSnapshotController,
	v1beta1.AttacherTypeBackupController, v1beta1.AttacherTypeVolumeCloneController, v1beta1.AttacherTypeSalvageController,
	v1beta1.AttacherTypeShareManagerController, v1beta1.AttacherTypeVolumeRestoreController,
	v1beta1.AttacherTypeVolumeEvictionController, v1beta1.AttacherTypeVolumeExpansionController,
	v1beta1.AttacherTypeBackingImageDataSourceController, v1beta1.AttacherTypeVolumeRebuildingController,
}

// maxCSITickets: a live migration is the one case of two CSI attachments,
// its source node and its target node.
const maxCSITickets = 2

type validator struct {
	ds *datastore.DataStore
}

// NewValidator returns the VolumeAttachment validator.
func NewValidator(ds *datastore.DataStore) admission.Validator { return &validator{ds: ds} }

func (v *validator) Resource() admission.Resource { return Resource }

func (v *validator) Create(_ *admission.Request, obj runtime.Object) error {
	va := obj.(*v1beta1.VolumeAttachment)
	var errs admission.FieldErrors
	if va.Spec.Volume == "" {
		errs.Add(admission.Invalid(volumePath, "required: the name of the volume these tickets are for"))
	} else if va.Name != va.Spec.Volume {
		errs.Add(admission.Invalid(namePath, "must equal spec.volume %q: a volume has one VolumeAttachment, named after it",
			va.Spec.Volume))
	}
	errs.Add(v.validTickets(va, nil)...)
	return errs.Err()
}

func (v *validator) Update(_ *admission.Request, oldObj, newObj runtime.Object) error {
	old, va := oldObj.(*v1beta1.VolumeAttachment), newObj.(*v1beta1.VolumeAttachment)
	var errs admission.FieldErrors
	if va.Spec.Volume != old.Spec.Volume {
		errs.Add(admission.Invalid(volumePath, "is immutable: cannot change from %q to %q", old.Spec.Volume, va.Spec.Volume))
	}
	errs.Add(v.validTickets(va, old)...)
	return errs.Err()
}

// validTickets checks every ticket's shape; a ticket's node, its
// disableFrontend parameter and the CSI ticket rule are checked only for
// tickets that are new or changed since old (nil on create), so that a node
// leaving the cluster, or a value stored before a rule existed, does not
// freeze the attachments that name it.
func (v *validator) validTickets(va, old *v1beta1.VolumeAttachment) []*admission.FieldError {
	var errs []*admission.FieldError
	var csi []*v1beta1.AttachmentTicket
	csiChanged := false
	for _, key := range slices.Sorted(maps.Keys(va.Spec.AttachmentTickets)) {
		t := va.Spec.AttachmentTickets[key]
		path := ticketsPath.Key(key)
		if t == nil {
			errs = append(errs, admission.Invalid(path, "must not be null"))
			continue
		}
		changed := true
		if old != nil {
			prev := old.Spec.AttachmentTickets[key]
			changed = prev == nil || ticketChanged(prev, t) || !reflect.DeepEqual(prev.OwnerRef, t.OwnerRef)
		}
		errs = append(errs, validTicketShape(path, key, t)...)
		if changed {
			errs = append(errs, v.validTicketNode(path, t), validDisableFrontend(path, t))
		}
		if t.Type == v1beta1.AttacherTypeCSIAttacher {
			csi = append(csi, t)
			csiChanged = csiChanged || changed
		}
	}
	if csiChanged {
		errs = append(errs, v.validCSITickets(va.Spec.Volume, csi))
	}
	return errs
}

func validTicketShape(path *field.Path, key string, t *v1beta1.AttachmentTicket) []*admission.FieldError {
	var errs []*admission.FieldError
	if t.ID != key {
		errs = append(errs, admission.Invalid(path.Child("id"), "%q differs from its map key %q: tickets are keyed by their ID",
			t.ID, key))
	}
	if !slices.Contains(knownAttacherTypes, t.Type) {
		errs = append(errs, admission.Invalid(path.Child("type"), "unknown attacher type %q; known: %s",
			t.Type, joinTypes(knownAttacherTypes)))
	}
	if ref := t.OwnerRef; ref != nil {
		refPath := path.Child("ownerRef")
		for _, f := range []struct{ name, value string }{{"apiVersion", ref.APIVersion}, {"kind", ref.Kind}, {"name", ref.Name}} {
			if f.value == "" {
				errs = append(errs, admission.Invalid(refPath.Child(f.name), "required: an owner reference names its object's %s",
					f.name))
			}
		}
	}
	return errs
}

// disableFrontendValues are what the disableFrontend parameter may say: the
// volume's frontend off, on, or either (system tickets that only read or
// copy data).
var disableFrontendValues = []string{v1beta1.TrueValue, v1beta1.FalseValue, v1beta1.AnyValue}

// validDisableFrontend: any other value would be read as "false" (the
// default when unset) by the controller, hiding a typo such as "ture".
func validDisableFrontend(path *field.Path, t *v1beta1.AttachmentTicket) *admission.FieldError {
	value, ok := t.Parameters[v1beta1.AttachmentParameterDisableFrontend]
	if !ok || slices.Contains(disableFrontendValues, value) {
		return nil
	}
	return admission.Invalid(path.Child("parameters").Key(v1beta1.AttachmentParameterDisableFrontend),
		"must be %q, %q or %q, got %q", v1beta1.TrueValue, v1beta1.FalseValue, v1beta1.AnyValue, value)
}

func (v *validator) validTicketNode(path *field.Path, t *v1beta1.AttachmentTicket) *admission.FieldError {
	if t.NodeID == "" {
		return admission.Invalid(path.Child("nodeID"), "required: the node the ticket asks the volume to be attached to")
	}
	if _, err := v.ds.Nodes.GetROOrLive(context.Background(), t.NodeID); apierrors.IsNotFound(err) {
		return admission.Invalid(path.Child("nodeID"), "%q is not a Strata node (there is no nodes.strata.io %s)",
			t.NodeID, t.NodeID)
	} else if err != nil {
		return admission.Invalid(path.Child("nodeID"), "cannot look up node %q: %v", t.NodeID, err)
	}
	return nil
}

// validCSITickets: at most two csi-attacher tickets, and two only while a
// migratable volume moves between two different nodes.
func (v *validator) validCSITickets(volume string, csi []*v1beta1.AttachmentTicket) *admission.FieldError {
	switch {
	case len(csi) <= 1:
		return nil
	case len(csi) > maxCSITickets:
		return admission.Invalid(ticketsPath, "%d csi-attacher tickets; at most %d (the source and target of a live migration)",
			len(csi), maxCSITickets)
	case csi[0].NodeID == csi[1].NodeID:
		return admission.Invalid(ticketsPath, "the two csi-attacher tickets %q and %q must name different nodes; both name %q",
			csi[0].ID, csi[1].ID, csi[0].NodeID)
	}
	vol, err := v.ds.Volumes.GetROOrLive(context.Background(), volume)
	if apierrors.IsNotFound(err) {
		return admission.Invalid(ticketsPath, "two csi-attacher tickets need a migratable volume, and volume %q does not exist",
			volume)
	} else if err != nil {
		return admission.Invalid(ticketsPath, "cannot look up volume %q: %v", volume, err)
	}
	if !vol.Spec.Migratable {
		return admission.Invalid(ticketsPath, "two csi-attacher tickets are allowed only for a migratable volume; "+
			"volume %q is not migratable", volume)
	}
	return nil
}

func joinTypes(ts []v1beta1.AttacherType) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}
