package volume

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
)

// workloadAttachers attach a volume for a user's I/O. The other attachers
// (snapshot, backup, clone, ... controllers) attach it for the system's own
// work, which lets go of a volume being deleted.
var workloadAttachers = []v1beta1.AttacherType{v1beta1.AttacherTypeCSIAttacher, v1beta1.AttacherTypeStrataAPI}

// Delete refuses to delete a volume a workload holds: the volume
// controller would stop its engine and delete its replicas' data under a
// client that is writing. The user detaches first, by removing the
// workload tickets from the VolumeAttachment (same name, same namespace).
// A volume already being deleted is let through: the deletion was decided
// before, and a repeated DELETE changes nothing.
func (v *validator) Delete(_ *admission.Request, obj runtime.Object) error {
	vol := obj.(*v1beta1.Volume)
	if vol.DeletionTimestamp != nil {
		return nil
	}
	// The API server's copy, not the cache's: the cache may not have seen a
	// ticket added or removed a moment ago (detach, then delete). Deletes
	// are rare; one read is cheap.
	va, err := v.ds.VolumeAttachments.GetLive(context.Background(), vol.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the VolumeAttachment of volume %s: %w", vol.Name, err)
	}
	ids := workloadTickets(va, vol.Name)
	if len(ids) == 0 {
		return nil
	}
	var held []string
	for _, id := range ids {
		t := va.Spec.AttachmentTickets[id]
		held = append(held, fmt.Sprintf("%q (%s on %s)", id, t.Type, t.NodeID))
	}
	noun := "ticket"
	if len(ids) > 1 {
		noun = "tickets"
	}
	return admission.Conflict("volume %s is in use: VolumeAttachment %s holds workload %s %s in spec.attachmentTickets; "+
		"detach it before deleting the volume by removing the %s: %s",
		vol.Name, va.Name, noun, strings.Join(held, ", "), noun, removeTicketsCommand(va.Namespace, va.Name, ids))
}

// workloadTickets lists the IDs of va's workload tickets, sorted; none when
// va is not volume's (the controller ignores such an attachment too).
func workloadTickets(va *v1beta1.VolumeAttachment, volume string) []string {
	if va.Spec.Volume != volume {
		return nil
	}
	var ids []string
	for id, t := range va.Spec.AttachmentTickets {
		if t != nil && slices.Contains(workloadAttachers, t.Type) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// removeTicketsCommand is the kubectl command that removes the tickets ids
// from a VolumeAttachment, as the README shows for one.
func removeTicketsCommand(namespace, name string, ids []string) string {
	type op struct {
		Op   string `json:"op"`
		Path string `json:"path"`
	}
	ops := make([]op, len(ids))
	pointer := strings.NewReplacer("~", "~0", "/", "~1") // RFC 6901
	for i, id := range ids {
		ops[i] = op{Op: "remove", Path: "/spec/attachmentTickets/" + pointer.Replace(id)}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(ops) // plain strings: cannot fail
	// The patch goes inside single quotes, where only a quote needs care.
	patch := strings.ReplaceAll(strings.TrimSpace(b.String()), "'", `'\''`)
	return fmt.Sprintf("kubectl -n %s patch va %s --type json -p '%s'", namespace, name, patch)
}
