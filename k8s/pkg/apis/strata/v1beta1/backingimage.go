package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// BackingImageSourceType is where a backing image's data comes from.
// One of "download", "upload", "export-from-volume".
// +kubebuilder:validation:Enum=download;upload;export-from-volume
type BackingImageSourceType string

const (
	BackingImageSourceTypeDownload         BackingImageSourceType = "download"
	BackingImageSourceTypeUpload           BackingImageSourceType = "upload"
	BackingImageSourceTypeExportFromVolume BackingImageSourceType = "export-from-volume"
)

// Export types of an export-from-volume source.
const (
	BackingImageExportTypeRaw   = "raw"
	BackingImageExportTypeQCOW2 = "qcow2"
)

// Source parameter names.
const (
	BackingImageParameterURL        = "url"
	BackingImageParameterVolumeName = "volume-name"
	BackingImageParameterExportType = "export-type"
)

// BackingImageState is the state of a backing image's file on one disk.
// One of "pending", "in-progress", "ready", "failed", "terminating", "unknown".
// +kubebuilder:validation:Enum=pending;in-progress;ready;failed;terminating;unknown
type BackingImageState string

const (
	BackingImageStatePending    BackingImageState = "pending"
	BackingImageStateInProgress BackingImageState = "in-progress"
	BackingImageStateReady      BackingImageState = "ready"
	BackingImageStateFailed     BackingImageState = "failed"
	// BackingImageStateTerminating: the copy is being removed from its disk;
	// the entry goes once the file is gone.
	BackingImageStateTerminating BackingImageState = "terminating"
	BackingImageStateUnknown     BackingImageState = "unknown"
)

// BackingImageDiskFileSpec asks for a copy of the image on one disk.
type BackingImageDiskFileSpec struct {
	// EvictionRequested asks to remove this copy once others exist.
	EvictionRequested bool `json:"evictionRequested,omitempty"`
}

// BackingImageDiskFileStatus is the state of the image's copy on one disk.
type BackingImageDiskFileStatus struct {
	// State of the copy. One of "pending", "in-progress", "ready", "failed", "terminating", "unknown".
	State BackingImageState `json:"state,omitempty"`
	// Progress of the transfer, in percent. Between 0 and 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Progress int32  `json:"progress,omitempty"`
	Message  string `json:"message,omitempty"`
	// Attempts counts the failed transfers since the copy was last ready;
	// each retry waits longer.
	Attempts int32 `json:"attempts,omitempty"`
	// LastStateTransitionTime is the RFC 3339 time State last changed.
	LastStateTransitionTime string `json:"lastStateTransitionTime,omitempty"`
	// FailedGeneration is the image's metadata.generation at which this
	// copy failed for good (a checksum mismatch, a format Strata refuses):
	// it is not tried again until the generation moves. 0 otherwise. At least 0.
	// +kubebuilder:validation:Minimum=0
	FailedGeneration int64 `json:"failedGeneration,omitempty"`
	// FailedSetting names the setting whose cap refused this copy when it
	// failed for good (backing-image-max-virtual-size, …), and
	// FailedSettingValue that setting's value then: the copy is tried again
	// once the value differs. Empty when no setting was involved.
	FailedSetting      string `json:"failedSetting,omitempty"`
	FailedSettingValue string `json:"failedSettingValue,omitempty"`
}

// BackingImageSpec is the desired state of a backing image.
type BackingImageSpec struct {
	// SourceType is where the data comes from. Immutable.
	// One of "download", "upload", "export-from-volume".
	// +kubebuilder:validation:Required
	SourceType BackingImageSourceType `json:"sourceType"`
	// SourceParameters configure the source: url for download; none for
	// upload (the bytes arrive through the manager's HTTP endpoint);
	// volume-name and export-type (raw or qcow2) for export-from-volume.
	// Immutable.
	SourceParameters map[string]string `json:"sourceParameters,omitempty"`
	// Checksum is the expected SHA-512 of the image's raw data, as 128 hex digits.
	// +kubebuilder:validation:Pattern=`^([a-f0-9]{128})?$`
	Checksum string `json:"checksum,omitempty"`
	// DiskFileSpecMap lists the disks (by UUID) that should hold a copy.
	DiskFileSpecMap map[string]*BackingImageDiskFileSpec `json:"diskFileSpecMap,omitempty"`
	// MinNumberOfCopies is how many disks should hold a copy at all times. At least 0.
	// +kubebuilder:validation:Minimum=0
	MinNumberOfCopies int32 `json:"minNumberOfCopies,omitempty"`
}

// BackingImageStatus is the observed state of a backing image.
type BackingImageStatus struct {
	// OwnerID is the node whose manager reconciles this backing image.
	OwnerID string `json:"ownerID,omitempty"`
	// UUID names the image's files on disk, so a re-created image of the same
	// name never reuses stale files.
	UUID string `json:"uuid,omitempty"`
	// Size is the image file's size in bytes.
	Size int64 `json:"size,omitempty"`
	// VirtualSize is the size of the block device the image holds, in bytes.
	VirtualSize int64 `json:"virtualSize,omitempty"`
	// Checksum is the SHA-512 of the image's data once known.
	Checksum string `json:"checksum,omitempty"`
	// DiskFileStatusMap is the state of each disk's copy, keyed by disk UUID.
	// +nullable
	DiskFileStatusMap map[string]*BackingImageDiskFileStatus `json:"diskFileStatusMap,omitempty"`
	// FirstCopyDisk is the disk (UUID) the source is fetched onto when no
	// disk holds a ready copy; every other disk copies from a ready copy.
	FirstCopyDisk string `json:"firstCopyDisk,omitempty"`
	// Copies is "ready/wanted": ready copies of the disks in spec.diskFileSpecMap.
	Copies string `json:"copies,omitempty"`
	// Message is the first failure among the copies ("<disk>: <why>"), if any.
	Message string `json:"message,omitempty"`
	// DiskLastRefAtMap records when each disk's copy was last used by a replica;
	// a copy unused for backing-image-cleanup-wait-interval is removed.
	// +nullable
	DiskLastRefAtMap map[string]string `json:"diskLastRefAtMap,omitempty"`
}

// BackingImage is a read-only image (raw or qcow2) that volumes are built on.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bi,categories=strata
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.sourceType`
// +kubebuilder:printcolumn:name="Copies",type=string,JSONPath=`.status.copies`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="VirtualSize",type=integer,JSONPath=`.status.virtualSize`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BackingImage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   BackingImageSpec   `json:"spec"`
	Status BackingImageStatus `json:"status,omitempty"`
}

// BackingImageList is a list of backing images.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type BackingImageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackingImage `json:"items"`
}
