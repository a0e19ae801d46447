package v1beta1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VolumeFrontend is how a volume's data is exposed to its user on the attached node.
// One of "nbd", "".
// +kubebuilder:validation:Enum=nbd;""
type VolumeFrontend string

const (
	// VolumeFrontendNBD serves the volume over the NBD protocol.
	VolumeFrontendNBD VolumeFrontend = "nbd"
	// VolumeFrontendNone attaches the engine with no frontend (for data operations only).
	VolumeFrontendNone VolumeFrontend = ""
)

// VolumeState is where a volume is in its lifecycle.
// One of "creating", "detached", "attaching", "attached", "detaching", "deleting".
// +kubebuilder:validation:Enum=creating;detached;attaching;attached;detaching;deleting
type VolumeState string

const (
	VolumeStateCreating  VolumeState = "creating"
	VolumeStateDetached  VolumeState = "detached"
	VolumeStateAttaching VolumeState = "attaching"
	VolumeStateAttached  VolumeState = "attached"
	VolumeStateDetaching VolumeState = "detaching"
	VolumeStateDeleting  VolumeState = "deleting"
)

// VolumeRobustness is how well a volume's data is protected right now.
// One of "healthy", "degraded", "faulted", "unknown".
// +kubebuilder:validation:Enum=healthy;degraded;faulted;unknown
type VolumeRobustness string

const (
	VolumeRobustnessHealthy  VolumeRobustness = "healthy"
	VolumeRobustnessDegraded VolumeRobustness = "degraded"
	VolumeRobustnessFaulted  VolumeRobustness = "faulted"
	VolumeRobustnessUnknown  VolumeRobustness = "unknown"
)

// VolumeCloneState is where filling a volume from its data source stands.
// One of "", "pending", "copying", "completed", "failed".
// +kubebuilder:validation:Enum="";pending;copying;completed;failed
type VolumeCloneState string

const (
	VolumeCloneStateNone      VolumeCloneState = ""
	VolumeCloneStatePending   VolumeCloneState = "pending"
	VolumeCloneStateCopying   VolumeCloneState = "copying"
	VolumeCloneStateCompleted VolumeCloneState = "completed"
	VolumeCloneStateFailed    VolumeCloneState = "failed"
)

// VolumeCloneStatus tells how filling the volume from spec.dataSource goes.
type VolumeCloneStatus struct {
	// SourceVolume is the volume the data comes from.
	SourceVolume string `json:"sourceVolume,omitempty"`
	// Snapshot is the source volume's snapshot being copied; for a vol://
	// source, a snapshot taken for the clone.
	Snapshot string `json:"snapshot,omitempty"`
	// State is where the clone stands: pending (waiting for the snapshot
	// and both volumes to attach), copying, completed or failed.
	// One of "", "pending", "copying", "completed", "failed".
	State VolumeCloneState `json:"state,omitempty"`
	// Progress is the percentage of the snapshot's data copied.
	Progress int32 `json:"progress,omitempty"`
	// Attempts counts the copies started; a failed copy is retried.
	Attempts int32 `json:"attempts,omitempty"`
	// Message says why the clone waits or failed.
	Message string `json:"message,omitempty"`
}

// VolumeRestoreState is where filling a volume from spec.fromBackup stands.
// One of "", "pending", "restoring", "completed", "failed".
// +kubebuilder:validation:Enum="";pending;restoring;completed;failed
type VolumeRestoreState string

const (
	VolumeRestoreStatePending   VolumeRestoreState = "pending"
	VolumeRestoreStateRestoring VolumeRestoreState = "restoring"
	VolumeRestoreStateCompleted VolumeRestoreState = "completed"
	VolumeRestoreStateFailed    VolumeRestoreState = "failed"
)

// VolumeRestoreStatus tells how filling the volume from spec.fromBackup goes.
type VolumeRestoreStatus struct {
	// Backup is the Backup restored; BackupVolume the volume it is filed
	// under on the target.
	Backup       string `json:"backup,omitempty"`
	BackupVolume string `json:"backupVolume,omitempty"`
	// State is where the restore stands: pending (waiting for the volume to
	// attach without a frontend), restoring, completed or failed.
	// One of "", "pending", "restoring", "completed", "failed".
	State VolumeRestoreState `json:"state,omitempty"`
	// Progress is the percentage of the backup's stored bytes fetched.
	Progress int32 `json:"progress,omitempty"`
	// BytesDone of BytesTotal stored (compressed) bytes fetched.
	BytesDone  int64 `json:"bytesDone,omitempty"`
	BytesTotal int64 `json:"bytesTotal,omitempty"`
	// Attempts counts the restores started; one that failed for a reason
	// that may pass (the target unreachable) is retried.
	Attempts int32 `json:"attempts,omitempty"`
	// Message says why the restore waits or failed.
	Message string `json:"message,omitempty"`
}

// SnapshotLimitExceeded begins a Snapshot's status.error when the volume's
// snapshot limits (spec.snapshotMaxCount, spec.snapshotMaxSize) refused the
// snapshot, so that a client (the CSI driver) tells this refusal, which
// the admin can lift, from a failure.
const SnapshotLimitExceeded = "snapshot limit exceeded"

// DataLocality says whether a volume keeps a replica where it is attached.
type DataLocality string

const (
	DataLocalityDisabled   DataLocality = "disabled"
	DataLocalityBestEffort DataLocality = "best-effort"
)

// FreezeFilesystem says whether a volume's snapshots are cut inside a
// freeze of its filesystem.
type FreezeFilesystem string

const (
	// FreezeFilesystemIgnored follows the freeze-filesystem-for-snapshot setting.
	FreezeFilesystemIgnored  FreezeFilesystem = "ignored"
	FreezeFilesystemEnabled  FreezeFilesystem = "enabled"
	FreezeFilesystemDisabled FreezeFilesystem = "disabled"
)

// VolumeSpec is the desired state of a volume.
type VolumeSpec struct {
	// The quantity rules skip a value that is no quantity (size: abc): the
	// schema's pattern refuses it already, and quantity() would add a
	// second, confusing error.

	// Size is the volume's capacity, for example 1Gi. It must be greater than
	// zero, and is rounded up to a multiple of 4096 bytes (the data plane's block).
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || quantity(string(self)).isGreaterThan(quantity('0'))",message="must be greater than 0"
	Size resource.Quantity `json:"size"`
	// NumberOfReplicas is how many copies of the data are kept, each on a
	// different node. When unset, the default-replica-count setting applies.
	// Between 1 and 20.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	NumberOfReplicas int32 `json:"numberOfReplicas,omitempty"`
	// Frontend is how the attached volume is exposed: "nbd", or "" for none.
	// One of "nbd", "".
	Frontend VolumeFrontend `json:"frontend,omitempty"`
	// BackingImage is the name of a BackingImage whose data lies under the volume's.
	BackingImage string `json:"backingImage,omitempty"`
	// DataSource fills a new volume from existing data: "snap://<volume>/<snapshot>"
	// or "vol://<volume>". Immutable.
	// +kubebuilder:validation:Pattern=`^((snap://[a-z0-9.-]+/[a-zA-Z0-9._-]+)|(vol://[a-z0-9.-]+))?$`
	DataSource string `json:"dataSource,omitempty"`
	// FromBackup fills a new volume with a Backup (its name in the system
	// namespace): the volume serves nothing before the restore completes.
	// Its backing image is the backup's unless spec.backingImage names
	// another copy of the same image (the same checksum). Immutable; not
	// with spec.dataSource. At most 253 characters.
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$`
	// +kubebuilder:validation:MaxLength=253
	FromBackup string `json:"fromBackup,omitempty"`
	// NodeID is the node the volume should be attached to. Written only by the
	// VolumeAttachment controller from the winning attachment ticket.
	NodeID string `json:"nodeID,omitempty"`
	// DisableFrontend attaches the engine without starting the frontend.
	DisableFrontend bool `json:"disableFrontend,omitempty"`
	// LastAttachedBy records which attacher last attached the volume.
	LastAttachedBy string `json:"lastAttachedBy,omitempty"`
	// Migratable allows two CSI attachments on two nodes during live migration.
	Migratable bool `json:"migratable,omitempty"`
	// DataLocality best-effort keeps a replica on the node the volume is
	// attached to: when none is there, one is added and rebuilt there, then a
	// replica elsewhere is removed, as long as that node can take it. A
	// local replica spares every write and read a network hop. Empty or
	// disabled: replicas stay where they were scheduled.
	// One of "disabled", "best-effort".
	// +kubebuilder:validation:Enum=disabled;best-effort
	DataLocality DataLocality `json:"dataLocality,omitempty"`
	// MigrationNodeID is the node a live migration moves the volume to: a
	// second engine runs there until the migration is confirmed (NodeID
	// becomes this node) or rolled back (this field is cleared). Written only
	// by the VolumeAttachment controller.
	MigrationNodeID string `json:"migrationNodeID,omitempty"`
	// SnapshotMaxCount caps the number of user snapshots (not marked removed)
	// in the chain; snapshots the system takes (rebuild, clone, export) do
	// not count. Left unset, the snapshot-max-count setting is filled in at
	// creation. Between 0 and 250. A value set must be at least 2; 0, on
	// volumes stored before the setting was filled in, means the setting
	// applies. It cannot be lowered below the user snapshots the volume holds.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=250
	SnapshotMaxCount int32 `json:"snapshotMaxCount,omitempty"`
	// SnapshotMaxSize caps the total size of the volume's snapshots (every
	// snapshot layer, removed ones until purged): no user snapshot is taken
	// once they hold this much. 0 means no cap; otherwise at least twice
	// spec.size. It cannot be lowered below what the snapshots hold.
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || !quantity(string(self)).isLessThan(quantity('0'))",message="must not be negative"
	SnapshotMaxSize resource.Quantity `json:"snapshotMaxSize,omitempty"`
	// FreezeFilesystemForSnapshot: enabled cuts every snapshot of the
	// volume, while it is staged with a filesystem on a node, inside a
	// freeze of that filesystem (what the application wrote is in the
	// snapshot); disabled cuts it as a power cut would; empty or ignored
	// follows the freeze-filesystem-for-snapshot setting.
	// One of "", "ignored", "enabled", "disabled".
	// +kubebuilder:validation:Enum="";ignored;enabled;disabled
	FreezeFilesystemForSnapshot FreezeFilesystem `json:"freezeFilesystemForSnapshot,omitempty"`
}

// VolumeStatus is the observed state of a volume.
type VolumeStatus struct {
	// OwnerID is the node whose manager reconciles this volume.
	OwnerID string `json:"ownerID,omitempty"`
	// State is where the volume is in its lifecycle.
	// One of "creating", "detached", "attaching", "attached", "detaching", "deleting".
	State VolumeState `json:"state,omitempty"`
	// Robustness tells whether every replica is healthy.
	// One of "healthy", "degraded", "faulted", "unknown".
	Robustness VolumeRobustness `json:"robustness,omitempty"`
	// CurrentNodeID is the node the volume is attached to. Set only once the
	// volume is fully attached, cleared only once it is fully detached.
	CurrentNodeID string `json:"currentNodeID,omitempty"`
	// CurrentMigrationNodeID is the node whose migration engine is running.
	CurrentMigrationNodeID string `json:"currentMigrationNodeID,omitempty"`
	// CurrentSize is the size the replicas have now, in bytes; it lags
	// spec.size until an expansion completes.
	CurrentSize int64 `json:"currentSize,omitempty"`
	// ActualSize is the space the volume's data takes on one replica, in
	// bytes: every layer of its chain (the head, its snapshots, and removed
	// snapshots not yet purged), as the data plane last reported it. It
	// keeps its last value while the volume is detached. A backing image is
	// not counted: one copy of it serves every volume on the disk.
	ActualSize int64 `json:"actualSize,omitempty"`
	// HeadSize, SnapshotsSize and RemovedSnapshotsSize split ActualSize:
	// the live head's layer; the layers of the snapshots a user can see
	// (kubectl get snap); and removed snapshots still in the chain, whose
	// data the volume still reads (a purge frees the rest) or a purge
	// has not yet freed. Each is what the layers allocate on one replica.
	HeadSize             int64 `json:"headSize"`
	SnapshotsSize        int64 `json:"snapshotsSize"`
	RemovedSnapshotsSize int64 `json:"removedSnapshotsSize"`
	// FrontendEndpoint is where the attached volume is served: an NBD URI of
	// its node's instance manager's unix socket, for example
	// nbd+unix:///v1?socket=/var/lib/strata/im-nbd/nbd.sock.
	FrontendEndpoint string `json:"frontendEndpoint,omitempty"`
	// CloneStatus tells how filling the volume from spec.dataSource goes.
	// The volume serves no workload before the clone is completed.
	CloneStatus *VolumeCloneStatus `json:"cloneStatus,omitempty"`
	// RestoreStatus tells how filling the volume from spec.fromBackup goes.
	// The volume serves no workload before the restore is completed.
	RestoreStatus *VolumeRestoreStatus `json:"restoreStatus,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Volume is a replicated block device.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vol,categories=strata
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Robustness",type=string,JSONPath=`.status.robustness`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.numberOfReplicas`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.spec.size`
// +kubebuilder:printcolumn:name="Actual",type=integer,JSONPath=`.status.actualSize`
// +kubebuilder:printcolumn:name="Head",type=integer,JSONPath=`.status.headSize`,priority=1
// +kubebuilder:printcolumn:name="Snapshots",type=integer,JSONPath=`.status.snapshotsSize`,priority=1
// +kubebuilder:printcolumn:name="Removed",type=integer,JSONPath=`.status.removedSnapshotsSize`,priority=1
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.currentNodeID`
// +kubebuilder:printcolumn:name="Clone",type=string,JSONPath=`.status.cloneStatus.state`
// +kubebuilder:printcolumn:name="Clone%",type=integer,JSONPath=`.status.cloneStatus.progress`
// +kubebuilder:printcolumn:name="Restore",type=string,JSONPath=`.status.restoreStatus.state`,priority=1
// +kubebuilder:printcolumn:name="Restore%",type=integer,JSONPath=`.status.restoreStatus.progress`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Volume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   VolumeSpec   `json:"spec"`
	Status VolumeStatus `json:"status,omitempty"`
}

// VolumeList is a list of volumes.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type VolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Volume `json:"items"`
}
