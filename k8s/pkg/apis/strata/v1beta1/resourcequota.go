package v1beta1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultResourceQuotaName is the one ResourceQuota per namespace Strata reads.
const DefaultResourceQuotaName = "default-resource-quota"

// SnapshotLimit caps the total snapshot size in a namespace and per VM.
type SnapshotLimit struct {
	// The rule skips a value that is no quantity: the isQuantity rule
	// k8s/codegen.sh gives every quantity (internal/devtools/crdquantity) refuses it
	// already, and quantity() would add a second, confusing error.

	// NamespaceTotalSnapshotSizeQuota caps the size of all snapshots of the
	// namespace's volumes, for example 100Gi; unset means no cap.
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || !quantity(string(self)).isLessThan(quantity('0'))",message="must not be negative"
	NamespaceTotalSnapshotSizeQuota *resource.Quantity `json:"namespaceTotalSnapshotSizeQuota,omitempty"`
	// VMTotalSnapshotSizeQuota caps the size of each VM's snapshots, keyed by
	// VM name, for example vm1: 20Gi. At most 4096 VMs: without a bound the
	// API server refuses the rule on the values as too costly.
	// +kubebuilder:validation:MaxProperties=4096
	VMTotalSnapshotSizeQuota map[string]resource.Quantity `json:"vmTotalSnapshotSizeQuota,omitempty"`
}

// SnapshotLimitStatus is the snapshot space in use: the allocated size of
// every snapshot not marked removed (never the live head) of the volumes
// behind the namespace's PVCs, and of each VM's PVCs. The quota controller
// keeps it current; admission reads the same figures from the cache.
type SnapshotLimitStatus struct {
	// NamespaceTotalSnapshotSizeUsage is what the namespace's volumes'
	// snapshots hold, deleted snapshots whose data is still on disk
	// included: it occupies the disk until a purge frees it.
	NamespaceTotalSnapshotSizeUsage *resource.Quantity `json:"namespaceTotalSnapshotSizeUsage,omitempty"`
	// NamespaceRemovedSnapshotSizeUsage is the part of the total that
	// deleted snapshots still hold (see Volume status.removedSnapshotsSize).
	NamespaceRemovedSnapshotSizeUsage *resource.Quantity           `json:"namespaceRemovedSnapshotSizeUsage,omitempty"`
	VMTotalSnapshotSizeUsage          map[string]resource.Quantity `json:"vmTotalSnapshotSizeUsage,omitempty"`
}

// ResourceQuotaSpec is the desired limits.
type ResourceQuotaSpec struct {
	SnapshotLimit SnapshotLimit `json:"snapshotLimit,omitempty"`
}

// ResourceQuotaStatus is the observed usage.
type ResourceQuotaStatus struct {
	SnapshotLimitStatus SnapshotLimitStatus `json:"snapshotLimitStatus,omitempty"`
}

// ResourceQuota limits snapshot space in a user namespace. Strata reads the
// one named default-resource-quota.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=srq,categories=strata
// +kubebuilder:printcolumn:name="NamespaceUsage",type=string,JSONPath=`.status.snapshotLimitStatus.namespaceTotalSnapshotSizeUsage`
// +kubebuilder:printcolumn:name="NamespaceQuota",type=string,JSONPath=`.spec.snapshotLimit.namespaceTotalSnapshotSizeQuota`
// +kubebuilder:printcolumn:name="VMUsage",type=string,JSONPath=`.status.snapshotLimitStatus.vmTotalSnapshotSizeUsage`
// +kubebuilder:printcolumn:name="VMQuota",type=string,JSONPath=`.spec.snapshotLimit.vmTotalSnapshotSizeQuota`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ResourceQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ResourceQuotaSpec   `json:"spec,omitempty"`
	Status ResourceQuotaStatus `json:"status,omitempty"`
}

// ResourceQuotaList is a list of resource quotas.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ResourceQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ResourceQuota `json:"items"`
}
