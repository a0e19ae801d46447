package datastore

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// TicketOwnerKey is the IndexByTicketOwner key of an object that may own
// attachment tickets: "<Kind.group>/<namespace>/<name>", for example
// "Snapshot.strata.io/strata-system/snap-1" or
// "VolumeAttachment.storage.k8s.io//csi-0123" (cluster-scoped). The kind is
// group-qualified so Strata's and Kubernetes' VolumeAttachments never meet.
func TicketOwnerKey(gk schema.GroupKind, namespace, name string) string {
	return gk.String() + "/" + namespace + "/" + name
}

// TicketOwnerGroupKind is the group and kind a ticket's owner reference names.
func TicketOwnerGroupKind(ref *v1beta1.TicketOwnerReference) schema.GroupKind {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		// Keep the unparsable apiVersion as the group: it still names the
		// owner consistently, and no watched kind matches it.
		return schema.GroupKind{Group: ref.APIVersion, Kind: ref.Kind}
	}
	return schema.GroupKind{Group: gv.Group, Kind: ref.Kind}
}

// TicketOwnerRefKey is the IndexByTicketOwner key of a ticket's owner.
func TicketOwnerRefKey(ref *v1beta1.TicketOwnerReference) string {
	return TicketOwnerKey(TicketOwnerGroupKind(ref), ref.Namespace, ref.Name)
}

// indexTicketOwners indexes a VolumeAttachment under the owner of each of
// its tickets, so the delete of an owner finds exactly the attachments to
// clean up.
func indexTicketOwners(obj interface{}) ([]string, error) {
	va, ok := obj.(*v1beta1.VolumeAttachment)
	if !ok {
		return nil, nil
	}
	var keys []string
	seen := map[string]bool{}
	for _, t := range va.Spec.AttachmentTickets {
		if t == nil || t.OwnerRef == nil || t.OwnerRef.Name == "" {
			continue
		}
		if k := TicketOwnerRefKey(t.OwnerRef); !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys, nil
}
