package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Condition types and reasons shared by several kinds. Kind-specific ones live
// next to their kind.
const (
	ConditionTypeReady       = "Ready"
	ConditionTypeSchedulable = "Schedulable"
)

// InstanceState is the state of an engine or replica instance, or of an
// instance manager, as the data plane reports it. One of "pending", "starting", "running", "stopping", "stopped", "error", "unknown".
// +kubebuilder:validation:Enum=pending;starting;running;stopping;stopped;error;unknown
type InstanceState string

const (
	InstanceStatePending  InstanceState = "pending"
	InstanceStateStarting InstanceState = "starting"
	InstanceStateRunning  InstanceState = "running"
	InstanceStateStopping InstanceState = "stopping"
	InstanceStateStopped  InstanceState = "stopped"
	InstanceStateError    InstanceState = "error"
	InstanceStateUnknown  InstanceState = "unknown"
)

// InstanceSpec is what engines and replicas share: where the instance runs and
// whether it should be running.
type InstanceSpec struct {
	// VolumeName is the volume this instance belongs to. Immutable. Must not be empty.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:MinLength=1
	VolumeName string `json:"volumeName"`
	// VolumeSize is the volume's size in bytes when the instance was last started.
	// At least 0.
	// +kubebuilder:validation:Minimum=0
	VolumeSize int64 `json:"volumeSize,omitempty"`
	// NodeID is the node the instance runs on; empty while unscheduled.
	NodeID string `json:"nodeID,omitempty"`
	// DesireState is the state the owning controller wants.
	// One of "pending", "starting", "running", "stopping", "stopped", "error", "unknown".
	DesireState InstanceState `json:"desireState,omitempty"`
	// BackingImage is the backing image under the volume's data, if any.
	BackingImage string `json:"backingImage,omitempty"`
}

// InstanceStatus is what engines and replicas share in status.
type InstanceStatus struct {
	// OwnerID is the node whose manager reconciles this object.
	OwnerID string `json:"ownerID,omitempty"`
	// CurrentState is the state the instance manager reports.
	// One of "pending", "starting", "running", "stopping", "stopped", "error", "unknown".
	CurrentState InstanceState `json:"currentState,omitempty"`
	// InstanceManagerName is the instance manager running the instance.
	InstanceManagerName string `json:"instanceManagerName,omitempty"`
	// IP and Port are where the instance serves its data connection.
	IP   string `json:"ip,omitempty"`
	Port int32  `json:"port,omitempty"`
	// Started is true once the instance has run at least once since it was scheduled.
	Started bool `json:"started,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
