package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// SnapshotSpec is the desired state of a snapshot. Immutable after creation.
type SnapshotSpec struct {
	// Volume is the volume this snapshot belongs to. Immutable. Must not be empty.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:MinLength=1
	Volume string `json:"volume"`
	// CreateSnapshot asks Strata to take a new snapshot with this CR's name.
	// False for CRs Strata made for snapshots that already exist in the engine.
	CreateSnapshot bool `json:"createSnapshot"`
	// Labels are stored with the snapshot in the engine.
	// +nullable
	Labels map[string]string `json:"labels"`
}

// SnapshotStatus mirrors the engine's record of the snapshot.
type SnapshotStatus struct {
	// Parent is the snapshot this one was taken on top of.
	Parent string `json:"parent"`
	// Children are the snapshots taken on top of this one.
	// +nullable
	Children map[string]bool `json:"children"`
	// MarkRemoved is true once the snapshot is removed and awaits purge.
	MarkRemoved bool `json:"markRemoved"`
	// UserCreated is false for snapshots the system took.
	UserCreated bool `json:"userCreated"`
	// CreationTime is the RFC 3339 time the engine took the snapshot.
	CreationTime string `json:"creationTime"`
	// Size is the allocated bytes of the snapshot's layer.
	Size int64 `json:"size"`
	// ExclusiveSize is the allocated bytes deleting this snapshot would
	// free now, given the chain: its whole layer if nothing was taken on
	// top of it; the blocks a newer snapshot on top of it also holds (the
	// purge merges the two, the newer blocks win); the blocks the live
	// volume overwrote or trimmed since, when it is the newest; nothing
	// while it has several children. The rest of its layer is data the
	// volume or a newer snapshot still reads.
	ExclusiveSize int64 `json:"exclusiveSize"`
	// Labels are the labels the engine holds for the snapshot.
	// +nullable
	Labels map[string]string `json:"labels"`
	// OwnerID is the node whose manager reconciles this snapshot.
	OwnerID string `json:"ownerID"`
	// Error says why the snapshot is not ready, for example that it was lost.
	Error string `json:"error,omitempty"`
	// RestoreSize is the size in bytes of a volume restored from this snapshot.
	RestoreSize int64 `json:"restoreSize"`
	// ReadyToUse is true when the snapshot exists, is not removed, and has no error.
	ReadyToUse bool `json:"readyToUse"`
	// Consistency says what the snapshot holds: "filesystem" (cut inside a
	// freeze of the volume's mounted filesystem: everything the application
	// wrote before it), "flushed" (a raw block volume, its page cache
	// flushed first) or "crash" (as a power cut would leave it: not staged
	// with a filesystem, or the freeze turned off). Empty for snapshots
	// taken before Strata recorded it.
	Consistency string `json:"consistency,omitempty"`
}

// Snapshot is a point-in-time snapshot of a volume. The CR's name is the
// snapshot's name in the engine.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=snap,categories=strata
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.volume`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Exclusive",type=integer,JSONPath=`.status.exclusiveSize`
// +kubebuilder:printcolumn:name="Consistency",type=string,JSONPath=`.status.consistency`,priority=1
// +kubebuilder:printcolumn:name="Created",type=string,JSONPath=`.status.creationTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Snapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   SnapshotSpec   `json:"spec"`
	Status SnapshotStatus `json:"status,omitempty"`
}

// SnapshotList is a list of snapshots.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type SnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Snapshot `json:"items"`
}

// TakenForStrata tells a snapshot Strata asks for itself, for another of its
// objects, from one a user asked for: a vol:// clone's snapshot of its
// source (owned by the target Volume), a backing image export's (owned by
// the BackingImage), a backup's (owned by the Backup). The engine takes
// those as system snapshots, which the volume's limits never refuse, and
// the snapshot quota does not charge them. Only the manager may create a
// snapshot with such an owner (the Snapshot webhook).
func (s *Snapshot) TakenForStrata() bool {
	for _, o := range s.OwnerReferences {
		if o.APIVersion != SchemeGroupVersion.String() {
			continue
		}
		if o.Kind == "BackingImage" || o.Kind == "Backup" || (o.Kind == "Volume" && o.Name != s.Spec.Volume) {
			return true
		}
	}
	return false
}
