package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// BackupTargetSpec is where backups are stored.
type BackupTargetSpec struct {
	// BackupTargetURL is the store's address, for example nfs://host:/path or file:///backups.
	BackupTargetURL string `json:"backupTargetURL,omitempty"`
	// CredentialSecret names a Secret in strata-system with the store's credentials.
	CredentialSecret string `json:"credentialSecret,omitempty"`
	// PollInterval is how often the store is listed for backups made elsewhere.
	PollInterval metav1.Duration `json:"pollInterval,omitempty"`
}

// BackupTargetStatus is the observed state of a backup target.
type BackupTargetStatus struct {
	OwnerID string `json:"ownerID,omitempty"`
	// Available is true when the store answered the last check.
	Available bool `json:"available,omitempty"`
	// LastSyncedAt is when the store was last listed.
	LastSyncedAt metav1.Time `json:"lastSyncedAt,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BackupTarget is a store that holds volume backups.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bt,categories=strata
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.backupTargetURL`
// +kubebuilder:printcolumn:name="Available",type=boolean,JSONPath=`.status.available`
// +kubebuilder:printcolumn:name="LastSynced",type=date,JSONPath=`.status.lastSyncedAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BackupTarget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BackupTargetSpec   `json:"spec,omitempty"`
	Status BackupTargetStatus `json:"status,omitempty"`
}

// BackupTargetList is a list of backup targets.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type BackupTargetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackupTarget `json:"items"`
}

// BackupVolumeSpec is the desired state of a backup volume.
type BackupVolumeSpec struct {
	// SyncRequestedAt asks for the volume's backups to be listed again.
	SyncRequestedAt metav1.Time `json:"syncRequestedAt,omitempty"`
}

// BackupVolumeStatus is what the store holds for one volume.
type BackupVolumeStatus struct {
	OwnerID string `json:"ownerID,omitempty"`
	// Size of the volume in bytes.
	Size int64 `json:"size,omitempty"`
	// +nullable
	Labels               map[string]string `json:"labels,omitempty"`
	CreatedAt            string            `json:"createdAt,omitempty"`
	LastBackupName       string            `json:"lastBackupName,omitempty"`
	LastBackupAt         string            `json:"lastBackupAt,omitempty"`
	DataStored           int64             `json:"dataStored,omitempty"`
	BackingImageName     string            `json:"backingImageName,omitempty"`
	BackingImageChecksum string            `json:"backingImageChecksum,omitempty"`
	LastSyncedAt         metav1.Time       `json:"lastSyncedAt,omitempty"`
}

// BackupVolume is the set of backups of one volume in the backup target.
// The BackupTarget's poll makes one for each volume the target holds
// backups of, and removes it once the target holds none, no Backup names
// the volume and the volume itself is deleted. While the volume exists it
// stays, with no last backup, ready for the next one.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bv,categories=strata
// +kubebuilder:printcolumn:name="LastBackup",type=string,JSONPath=`.status.lastBackupName`
// +kubebuilder:printcolumn:name="LastBackupAt",type=string,JSONPath=`.status.lastBackupAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BackupVolume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BackupVolumeSpec   `json:"spec,omitempty"`
	Status BackupVolumeStatus `json:"status,omitempty"`
}

// BackupVolumeList is a list of backup volumes.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type BackupVolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackupVolume `json:"items"`
}

// BackupState is where a backup is in its lifecycle.
// One of "", "New", "Pending", "InProgress", "Completed", "Error", "Unknown".
// +kubebuilder:validation:Enum="";New;Pending;InProgress;Completed;Error;Unknown
type BackupState string

const (
	BackupStateNew        BackupState = "New"
	BackupStatePending    BackupState = "Pending"
	BackupStateInProgress BackupState = "InProgress"
	BackupStateCompleted  BackupState = "Completed"
	BackupStateError      BackupState = "Error"
	BackupStateUnknown    BackupState = "Unknown"
)

// BackupSpec is the desired state of a backup. A Backup (in strata-system)
// goes to the BackupTarget named "default" and is of one of two things:
//   - a snapshot: spec.snapshotName names it; the volume is the snapshot's.
//   - a whole volume, as it is now: no spec.snapshotName, and the label
//     strata.io/volume=<volume> on the Backup. A snapshot named like the
//     Backup is taken first (a system snapshot, deleted with the Backup); a
//     detached volume is attached for the backup and detached again.
//
// A whole volume, for example: metadata: {name: db-1, labels:
// {strata.io/volume: db}} and no spec. A backup is incremental on the
// volume's newest completed backup whose snapshot still exists
// (status.incrementalOn).
type BackupSpec struct {
	// SnapshotName is the snapshot to back up; the volume is the snapshot's
	// volume. Empty backs up the volume the label strata.io/volume names.
	SnapshotName string `json:"snapshotName,omitempty"`
	// Labels are stored with the backup on the target (not the Backup's own
	// metadata.labels).
	// +nullable
	Labels map[string]string `json:"labels,omitempty"`
	// VerifyRequestedAt asks for the backup's blocks to be read back from the
	// target and checked against their hashes: set it to a new value (the
	// time, say) and status.verification answers for that value.
	VerifyRequestedAt string `json:"verifyRequestedAt,omitempty"`
}

// BackupVerifyState is where the verification of a backup stands.
// One of "", "InProgress", "Passed", "Failed".
// +kubebuilder:validation:Enum="";InProgress;Passed;Failed
type BackupVerifyState string

const (
	BackupVerifyInProgress BackupVerifyState = "InProgress"
	BackupVerifyPassed     BackupVerifyState = "Passed"
	BackupVerifyFailed     BackupVerifyState = "Failed"
)

// BackupVerification is the outcome of the last verification asked for.
type BackupVerification struct {
	// RequestedAt is the spec.verifyRequestedAt this answers.
	RequestedAt string `json:"requestedAt,omitempty"`
	// One of "", "InProgress", "Passed", "Failed".
	State BackupVerifyState `json:"state,omitempty"`
	// Chunks checked, and when the check finished.
	Chunks     int64       `json:"chunks,omitempty"`
	VerifiedAt metav1.Time `json:"verifiedAt,omitempty"`
	// Error names the first block that failed, or why the check could not run.
	Error string `json:"error,omitempty"`
}

// BackupStatus is the observed state of a backup.
type BackupStatus struct {
	OwnerID string `json:"ownerID,omitempty"`
	// State is where the backup is in its lifecycle.
	// One of "", "New", "Pending", "InProgress", "Completed", "Error", "Unknown".
	State BackupState `json:"state,omitempty"`
	// Progress of the upload, in percent. Between 0 and 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Progress int32 `json:"progress,omitempty"`
	// BytesDone of BytesTotal is what the running upload has read of the
	// snapshot (only what changed since the base, for an incremental);
	// written with progress, cleared once the backup is completed.
	BytesDone         int64  `json:"bytesDone,omitempty"`
	BytesTotal        int64  `json:"bytesTotal,omitempty"`
	URL               string `json:"url,omitempty"`
	SnapshotName      string `json:"snapshotName,omitempty"`
	SnapshotCreatedAt string `json:"snapshotCreatedAt,omitempty"`
	BackupCreatedAt   string `json:"backupCreatedAt,omitempty"`
	// Size is what the backup holds on the target, in stored (compressed)
	// bytes: every chunk it references, the ones an incremental backup
	// shares with the backups before it included.
	Size int64 `json:"size,omitempty"`
	// UploadedBytes is what this backup uploaded, in stored bytes: only
	// chunks the target did not hold yet. For an incremental backup, about
	// what changed since incrementalOn.
	UploadedBytes int64 `json:"uploadedBytes,omitempty"`
	// IncrementalOn is the backup this one is incremental on: only what
	// changed since its snapshot was read. Empty for a full backup.
	IncrementalOn string `json:"incrementalOn,omitempty"`
	// +nullable
	Labels                 map[string]string `json:"labels,omitempty"`
	Error                  string            `json:"error,omitempty"`
	VolumeName             string            `json:"volumeName,omitempty"`
	VolumeSize             int64             `json:"volumeSize,omitempty"`
	VolumeBackingImageName string            `json:"volumeBackingImageName,omitempty"`
	// VolumeBackingImageURL and VolumeBackingImageChecksum are what the
	// backup recorded of its backing image, so a restore can fetch it again
	// or be pointed at another copy of it.
	VolumeBackingImageURL      string `json:"volumeBackingImageURL,omitempty"`
	VolumeBackingImageChecksum string `json:"volumeBackingImageChecksum,omitempty"`
	// Verification is the outcome of the last spec.verifyRequestedAt.
	Verification *BackupVerification `json:"verification,omitempty"`
	LastSyncedAt metav1.Time         `json:"lastSyncedAt,omitempty"`
}

// Backup is one backup of a volume snapshot in the backup target.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bk,categories=strata
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.status.snapshotName`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Progress",type=integer,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="BytesDone",type=integer,JSONPath=`.status.bytesDone`,priority=1
// +kubebuilder:printcolumn:name="BytesTotal",type=integer,JSONPath=`.status.bytesTotal`,priority=1
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Uploaded",type=integer,JSONPath=`.status.uploadedBytes`
// +kubebuilder:printcolumn:name="IncrementalOn",type=string,JSONPath=`.status.incrementalOn`,priority=1
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.status.volumeName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Backup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BackupSpec   `json:"spec,omitempty"`
	Status BackupStatus `json:"status,omitempty"`
}

// BackupList is a list of backups.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type BackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Backup `json:"items"`
}
