package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// AttacherType names who asks for a volume to be attached.
// One of "csi-attacher", "strata-api", "snapshot-controller", "backup-controller", "volume-clone-controller", "salvage-controller", "share-manager-controller", "volume-restore-controller", "volume-eviction-controller", "volume-expansion-controller", "bim-ds-controller", "volume-rebuilding-controller".
// +kubebuilder:validation:Enum=csi-attacher;strata-api;snapshot-controller;backup-controller;volume-clone-controller;salvage-controller;share-manager-controller;volume-restore-controller;volume-eviction-controller;volume-expansion-controller;bim-ds-controller;volume-rebuilding-controller
type AttacherType string

const (
	AttacherTypeCSIAttacher                      AttacherType = "csi-attacher"
	AttacherTypeStrataAPI                        AttacherType = "strata-api"
	AttacherTypeSnapshotController               AttacherType = "snapshot-controller"
	AttacherTypeBackupController                 AttacherType = "backup-controller"
	AttacherTypeVolumeCloneController            AttacherType = "volume-clone-controller"
	AttacherTypeSalvageController                AttacherType = "salvage-controller"
	AttacherTypeShareManagerController           AttacherType = "share-manager-controller"
	AttacherTypeVolumeRestoreController          AttacherType = "volume-restore-controller"
	AttacherTypeVolumeEvictionController         AttacherType = "volume-eviction-controller"
	AttacherTypeVolumeExpansionController        AttacherType = "volume-expansion-controller"
	AttacherTypeBackingImageDataSourceController AttacherType = "bim-ds-controller"
	AttacherTypeVolumeRebuildingController       AttacherType = "volume-rebuilding-controller"
)

// Attacher priorities: restoring data beats user workloads, which beat
// snapshot and backup operations.
const (
	AttacherPriorityLevelVolumeRestoreController          = 2000
	AttacherPriorityLevelVolumeExpansionController        = 2000
	AttacherPriorityLevelStrataAPI                        = 1000
	AttacherPriorityLevelCSIAttacher                      = 900
	AttacherPriorityLevelSalvageController                = 900
	AttacherPriorityLevelShareManagerController           = 900
	AttacherPriorityLevelSnapshotController               = 800
	AttacherPriorityLevelBackupController                 = 800
	AttacherPriorityLevelVolumeCloneController            = 800
	AttacherPriorityLevelVolumeEvictionController         = 800
	AttacherPriorityLevelBackingImageDataSourceController = 800
	AttacherPriorityLevelVolumeRebuildingController       = 800
)

// Ticket parameter names and values.
const (
	TrueValue  = "true"
	FalseValue = "false"
	AnyValue   = "any"

	AttachmentParameterDisableFrontend = "disableFrontend"
	AttachmentParameterLastAttachedBy  = "lastAttachedBy"
)

// Ticket status condition type and reasons.
const (
	AttachmentStatusConditionTypeSatisfied = "Satisfied"

	AttachmentStatusConditionReasonAttachedWithIncompatibleParameters = "AttachedWithIncompatibleParameters"
)

// AttachmentTicket is one request to have the volume attached to a node.
type AttachmentTicket struct {
	// ID is unique among the volume's tickets and equals the ticket's map key.
	ID string `json:"id"`
	// Type is who asks: it sets the ticket's priority.
	// One of "csi-attacher", "strata-api", "snapshot-controller", "backup-controller", "volume-clone-controller", "salvage-controller", "share-manager-controller", "volume-restore-controller", "volume-eviction-controller", "volume-expansion-controller", "bim-ds-controller", "volume-rebuilding-controller".
	Type AttacherType `json:"type"`
	// NodeID is the node the ticket asks for.
	NodeID string `json:"nodeID"`
	// Parameters of the attachment: disableFrontend ("true", "false" - the
	// default when unset - or "any") and lastAttachedBy.
	Parameters map[string]string `json:"parameters"`
	// Generation is bumped by the system on every change of the ticket. Read-only.
	Generation int64 `json:"generation"`
	// OwnerRef names the object that asked for the ticket (a Snapshot, a
	// Backup, a storage.k8s.io VolumeAttachment, a Volume being cloned). When
	// that object is gone the ticket is removed, so an interrupted operation
	// never leaves the volume attached.
	// +optional
	OwnerRef *TicketOwnerReference `json:"ownerRef,omitempty"`
}

// TicketOwnerReference identifies the object a ticket belongs to.
type TicketOwnerReference struct {
	// APIVersion of the owner, for example strata.io/v1beta1 or storage.k8s.io/v1.
	// Must not be empty.
	// +kubebuilder:validation:MinLength=1
	APIVersion string `json:"apiVersion"`
	// Kind of the owner, for example Snapshot. Must not be empty.
	// +kubebuilder:validation:MinLength=1
	Kind string `json:"kind"`
	// Namespace of the owner; empty for cluster-scoped kinds.
	Namespace string `json:"namespace,omitempty"`
	// Name of the owner. Must not be empty.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// UID of the owner: an object recreated with the same name does not own the ticket.
	UID string `json:"uid,omitempty"`
}

// AttachmentTicketStatus says whether a ticket is satisfied, and why not.
type AttachmentTicketStatus struct {
	// ID of the ticket this status is for.
	ID string `json:"id"`
	// Satisfied is true when the volume is attached as the ticket asks.
	Satisfied bool `json:"satisfied"`
	// Conditions record why the ticket is or is not satisfied.
	// +nullable
	Conditions []metav1.Condition `json:"conditions"`
	// Generation is the ticket generation this status was computed for.
	Generation int64 `json:"generation"`
}

// VolumeAttachmentSpec is the set of attachment tickets for one volume.
type VolumeAttachmentSpec struct {
	// AttachmentTickets are keyed by ticket ID.
	AttachmentTickets map[string]*AttachmentTicket `json:"attachmentTickets"`
	// Volume is the volume these tickets are for. Immutable. Must not be empty.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:MinLength=1
	Volume string `json:"volume"`
}

// VolumeAttachmentStatus holds a status per ticket, and a summary of them for
// kubectl get va.
type VolumeAttachmentStatus struct {
	// AttachmentTicketStatuses are keyed by ticket ID.
	AttachmentTicketStatuses map[string]*AttachmentTicketStatus `json:"attachmentTicketStatuses"`
	// CurrentNodeID is the node the volume is attached to (the volume's
	// status.currentNodeID); empty while it is detached.
	CurrentNodeID string `json:"currentNodeID,omitempty"`
	// Tickets counts the tickets the statuses are for.
	Tickets int32 `json:"tickets"`
	// SatisfiedTickets counts the tickets that are satisfied.
	SatisfiedTickets int32 `json:"satisfiedTickets"`
}

// VolumeAttachment collects every request to attach one volume; there is one
// per volume, with the volume's name.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=va,categories=strata
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.volume`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.currentNodeID`
// +kubebuilder:printcolumn:name="Tickets",type=integer,JSONPath=`.status.tickets`
// +kubebuilder:printcolumn:name="Satisfied",type=integer,JSONPath=`.status.satisfiedTickets`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VolumeAttachment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   VolumeAttachmentSpec   `json:"spec"`
	Status VolumeAttachmentStatus `json:"status,omitempty"`
}

// VolumeAttachmentList is a list of volume attachments.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type VolumeAttachmentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VolumeAttachment `json:"items"`
}
