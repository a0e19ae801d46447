package v1beta1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node condition reasons.
const (
	NodeConditionReasonManagerRunning = "ManagerRunning"
	NodeConditionReasonManagerDown    = "ManagerDown"
	NodeConditionReasonNoDisk         = "NoSchedulableDisk"
	NodeConditionReasonSchedulingOff  = "SchedulingDisabled"
	NodeConditionReasonHasDisk        = "SchedulableDiskFound"

	DiskConditionReasonReady       = "DiskReady"
	DiskConditionReasonPathMissing = "DiskPathMissing"
	// DiskConditionReasonMigrated: the disk's UUID is now found under
	// another entry (remounted at another path); this entry's path is stale.
	DiskConditionReasonMigrated    = "DiskMigrated"
	DiskConditionReasonUUIDError   = "DiskUUIDError"
	DiskConditionReasonFull        = "DiskFull"
	DiskConditionReasonSchedOff    = "SchedulingDisabled"
	DiskConditionReasonSchedulable = "DiskSchedulable"
)

// DiskSpec is one directory Strata may put replica data in.
type DiskSpec struct {
	// Path is the absolute directory on the node.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:Pattern=`^/`
	Path string `json:"path"`
	// AllowScheduling lets new replicas be placed on this disk.
	AllowScheduling bool `json:"allowScheduling"`
	// StorageReserved is space on the disk Strata must leave free, for example 10Gi.
	// The rule checks the sign on the text: a quantity() rule inside the
	// disks map costs more than the API server allows.
	// +kubebuilder:validation:XValidation:rule="!string(self).startsWith('-')",message="must not be negative"
	StorageReserved resource.Quantity `json:"storageReserved,omitempty"`
}

// DiskStatus is the observed state of one disk.
type DiskStatus struct {
	// DiskUUID is read from (or written to) the disk's strata-disk.cfg, so a
	// disk keeps its identity when its path changes.
	DiskUUID string `json:"diskUUID,omitempty"`
	// StorageMaximum is the filesystem's size in bytes.
	StorageMaximum int64 `json:"storageMaximum,omitempty"`
	// StorageAvailable is the free space in bytes.
	StorageAvailable int64 `json:"storageAvailable,omitempty"`
	// StorageScheduled is the sum of the sizes of the replicas placed here, in bytes.
	StorageScheduled int64 `json:"storageScheduled,omitempty"`
	// ScheduledReplica maps replica names on this disk to their sizes in bytes.
	ScheduledReplica map[string]int64 `json:"scheduledReplica,omitempty"`
	// OrphanedReplicaDirectories lists replica data directories on this disk
	// that no Replica names any more: their replica went while the node's
	// data plane was unreachable. The node's manager deletes them once its
	// instance manager runs again, after checking no replica names them.
	// +optional
	// +listType=set
	OrphanedReplicaDirectories []string `json:"orphanedReplicaDirectories,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeSpec is the desired state of a storage node.
type NodeSpec struct {
	// Disks are keyed by disk name.
	// At most 16 disks: the bound keeps the storageReserved rule within the
	// API server's validation cost budget.
	// +kubebuilder:validation:MaxProperties=16
	Disks map[string]DiskSpec `json:"disks,omitempty"`
	// AllowScheduling lets new replicas be placed on this node.
	AllowScheduling bool `json:"allowScheduling"`
	// Tags select nodes for volumes that ask for them.
	Tags []string `json:"tags,omitempty"`
}

// NodeStatus is the observed state of a storage node.
type NodeStatus struct {
	// Ready is True while the node's manager holds its heartbeat lease;
	// Schedulable is True when some disk can take a new replica.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// DiskStatus is keyed by disk name.
	DiskStatus map[string]*DiskStatus `json:"diskStatus,omitempty"`
	// DiskPaths lists the disk paths, for display.
	DiskPaths string `json:"diskPaths,omitempty"`
	// APIAddress is where the node's manager serves its HTTP API (host:port):
	// backing image uploads, and the copies other managers fetch from its disks.
	APIAddress string `json:"apiAddress,omitempty"`
}

// Node is a node that holds Strata data; its manager registers it.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=snode,categories=strata
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="AllowScheduling",type=boolean,JSONPath=`.spec.allowScheduling`
// +kubebuilder:printcolumn:name="Schedulable",type=string,JSONPath=`.status.conditions[?(@.type=="Schedulable")].status`
// +kubebuilder:printcolumn:name="Disks",type=string,JSONPath=`.status.diskPaths`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Node struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeSpec   `json:"spec,omitempty"`
	Status NodeStatus `json:"status,omitempty"`
}

// NodeList is a list of nodes.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type NodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Node `json:"items"`
}
