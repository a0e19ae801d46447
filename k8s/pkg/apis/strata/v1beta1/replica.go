package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ReplicaSpec is the desired state of one copy of a volume's data.
type ReplicaSpec struct {
	InstanceSpec `json:",inline"`
	// EngineName is the engine this replica serves.
	EngineName string `json:"engineName,omitempty"`
	// DiskID is the UUID of the disk holding the replica's data.
	DiskID string `json:"diskID,omitempty"`
	// DiskName is that disk's name in its node's spec.disks, as it was when
	// the replica was placed there.
	DiskName string `json:"diskName,omitempty"`
	// DiskPath is the path of that disk on its node.
	DiskPath string `json:"diskPath,omitempty"`
	// DataDirectoryName is the replica's directory under DiskPath.
	DataDirectoryName string `json:"dataDirectoryName,omitempty"`
	// FailedAt is the RFC 3339 time the replica last failed; empty while healthy.
	FailedAt string `json:"failedAt,omitempty"`
	// HealthyAt is the RFC 3339 time the replica last became healthy (RW).
	HealthyAt string `json:"healthyAt,omitempty"`
	// RebuildRetryCount counts failed rebuild attempts. At least 0.
	// +kubebuilder:validation:Minimum=0
	RebuildRetryCount int32 `json:"rebuildRetryCount,omitempty"`
}

// ReplicaStatus is the observed state of a replica.
type ReplicaStatus struct {
	InstanceStatus `json:",inline"`
}

// Replica is one copy of a volume's data: a chain of snapshot layers in a
// directory on one node's disk.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rep,categories=strata
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.volumeName`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.currentState`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeID`
// +kubebuilder:printcolumn:name="Disk",type=string,JSONPath=`.spec.diskName`
// +kubebuilder:printcolumn:name="DiskID",type=string,JSONPath=`.spec.diskID`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Replica struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicaSpec   `json:"spec,omitempty"`
	Status ReplicaStatus `json:"status,omitempty"`
}

// ReplicaList is a list of replicas.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ReplicaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Replica `json:"items"`
}
