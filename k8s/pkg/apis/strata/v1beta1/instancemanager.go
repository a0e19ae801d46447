package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ConditionTypeUpToDate: the instance manager's Pod runs its DaemonSet's
// newest revision.
const ConditionTypeUpToDate = "UpToDate"

// InstanceManagerSpec is the desired state of a node's data plane.
type InstanceManagerSpec struct {
	// NodeID is the node this instance manager runs on. Must not be empty.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:MinLength=1
	NodeID string `json:"nodeID"`
}

// InstanceManagerStatus is the observed state of a node's data plane.
type InstanceManagerStatus struct {
	// OwnerID is the node whose manager keeps this status: the same node.
	OwnerID string `json:"ownerID,omitempty"`
	// CurrentState is whether the instance manager answers.
	// One of "pending", "starting", "running", "stopping", "stopped", "error", "unknown".
	CurrentState InstanceState `json:"currentState,omitempty"`
	// Endpoint is the instance manager's gRPC address.
	Endpoint string `json:"endpoint,omitempty"`
	// Conditions: Ready (the instance manager answers) and, where the
	// instance managers are Pods, UpToDate (the Pod runs its DaemonSet's
	// newest revision, or why it is not replaced yet).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// InstanceManager is the data plane of one node: it runs the node's engine
// and replica instances.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=im,categories=strata
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.currentState`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeID`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InstanceManager struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   InstanceManagerSpec   `json:"spec"`
	Status InstanceManagerStatus `json:"status,omitempty"`
}

// InstanceManagerList is a list of instance managers.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type InstanceManagerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InstanceManager `json:"items"`
}
