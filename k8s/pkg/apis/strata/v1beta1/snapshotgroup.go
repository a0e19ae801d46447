package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// SnapshotGroupSpec is what a group snapshot holds. Immutable.
type SnapshotGroupSpec struct {
	// Volumes are the volumes whose snapshots are taken together, at one
	// crash-consistent point of all their writes: as if every volume had
	// lost power at the same instant. Each volume once. At most 64 volumes.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="volumes are immutable"
	// +listType=set
	Volumes []string `json:"volumes"`
	// Labels are put on every member snapshot. At most 64 entries.
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="labels are immutable"
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
}

// SnapshotGroupMaxVolumes bounds spec.volumes (the CRD's MaxItems).
const SnapshotGroupMaxVolumes = 64

// SnapshotGroupState is where a group snapshot stands.
// One of "Pending", "Cutting", "Ready", "Failed".
// +kubebuilder:validation:Enum=Pending;Cutting;Ready;Failed
type SnapshotGroupState string

const (
	// SnapshotGroupPending: waiting for every volume's engine to run.
	SnapshotGroupPending SnapshotGroupState = "Pending"
	// SnapshotGroupCutting: a cut began; if its manager died meanwhile, the
	// next one removes whatever part of it was taken and cuts again.
	SnapshotGroupCutting SnapshotGroupState = "Cutting"
	SnapshotGroupReady   SnapshotGroupState = "Ready"
	// SnapshotGroupFailed: a volume is gone or refused for good (Error
	// says which); delete the group and make another.
	SnapshotGroupFailed SnapshotGroupState = "Failed"
)

// SnapshotGroupMember is one volume's snapshot of the group.
type SnapshotGroupMember struct {
	// +kubebuilder:validation:Required
	Volume string `json:"volume"`
	// Snapshot is the Snapshot (CR and engine name) of the volume.
	// +kubebuilder:validation:Required
	Snapshot string `json:"snapshot"`
}

// SnapshotGroupStatus is the observed state of a group snapshot.
type SnapshotGroupStatus struct {
	// OwnerID is the node whose manager takes the group's cut.
	OwnerID string `json:"ownerID,omitempty"`
	// State is where the group stands. One of "Pending", "Cutting", "Ready", "Failed".
	State SnapshotGroupState `json:"state,omitempty"`
	// Attempt counts the cuts begun; a retry's snapshots carry it in their
	// names, since a failed cut's removed snapshots keep theirs until purged.
	Attempt int32 `json:"attempt,omitempty"`
	// Snapshots are the member snapshots, one per volume, once Ready.
	// +listType=map
	// +listMapKey=volume
	// +optional
	Snapshots []SnapshotGroupMember `json:"snapshots,omitempty"`
	// ReadyToUse is true once every member snapshot is taken.
	ReadyToUse bool `json:"readyToUse"`
	// CreationTime is the RFC 3339 time of the cut.
	CreationTime string `json:"creationTime,omitempty"`
	// StallMilliseconds is how long the cut held the volumes' writes.
	StallMilliseconds int64 `json:"stallMilliseconds,omitempty"`
	// Error says why the group is not ready yet, or why it failed.
	Error string `json:"error,omitempty"`
}

// SnapshotGroup is a crash-consistent snapshot of several volumes (a VM's
// disks, a database's data and log volumes): every engine stops
// acknowledging writes and drains those in flight, each takes its snapshot,
// then all resume. Its member Snapshots carry the label
// strata.io/snapshot-group=<name>; deleting the group deletes them.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=snapgroup,categories=strata
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Volumes",type=string,JSONPath=`.spec.volumes`
// +kubebuilder:printcolumn:name="Stall(ms)",type=integer,JSONPath=`.status.stallMilliseconds`
// +kubebuilder:printcolumn:name="Created",type=string,JSONPath=`.status.creationTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SnapshotGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   SnapshotGroupSpec   `json:"spec"`
	Status SnapshotGroupStatus `json:"status,omitempty"`
}

// SnapshotGroupList is a list of group snapshots.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type SnapshotGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SnapshotGroup `json:"items"`
}
