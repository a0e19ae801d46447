package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// RecurringJobTask is what a recurring job does on each run.
// One of "snapshot", "snapshot-group", "snapshot-cleanup", "snapshot-delete", "backup".
// +kubebuilder:validation:Enum=snapshot;snapshot-group;snapshot-cleanup;snapshot-delete;backup
type RecurringJobTask string

const (
	RecurringJobTaskSnapshot        RecurringJobTask = "snapshot"
	RecurringJobTaskSnapshotCleanup RecurringJobTask = "snapshot-cleanup"
	RecurringJobTaskSnapshotDelete  RecurringJobTask = "snapshot-delete"
	RecurringJobTaskBackup          RecurringJobTask = "backup"
	// RecurringJobTaskSnapshotGroup takes one crash-consistent
	// SnapshotGroup of all the selected volumes per run.
	RecurringJobTaskSnapshotGroup RecurringJobTask = "snapshot-group"
)

// RecurringJobSpec is the desired state of a recurring job.
type RecurringJobSpec struct {
	// Groups select volumes by their job-group labels.
	Groups []string `json:"groups,omitempty"`
	// Task is what each run does.
	// One of "snapshot", "snapshot-group", "snapshot-cleanup", "snapshot-delete", "backup".
	// +kubebuilder:validation:Required
	Task RecurringJobTask `json:"task"`
	// Cron is the schedule, in five-field cron syntax. Must not be empty.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:MinLength=1
	Cron string `json:"cron"`
	// Retain is how many of this job's snapshots or backups to keep per
	// volume (of a snapshot-group job: how many of its groups).
	// Between 0 and 250.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=250
	Retain int32 `json:"retain,omitempty"`
	// Concurrency is how many volumes a run works on at once. At least 1.
	// +kubebuilder:validation:Minimum=1
	Concurrency int32 `json:"concurrency,omitempty"`
	// Labels are put on every snapshot or backup the job makes.
	Labels map[string]string `json:"labels,omitempty"`
}

// RecurringJobStatus is the observed state of a recurring job.
type RecurringJobStatus struct {
	OwnerID string `json:"ownerID,omitempty"`
	// ExecutionCount counts runs since the job was created.
	ExecutionCount int64 `json:"executionCount,omitempty"`
	// LastRunAt is when the job last ran.
	LastRunAt metav1.Time `json:"lastRunAt,omitempty"`
	// LastScheduledAt is the schedule's tick the last run was for: a
	// manager that comes back after missing ticks runs once for the latest.
	LastScheduledAt metav1.Time `json:"lastScheduledAt,omitempty"`
	// LastRunVolumes counts the volumes the last run worked on, and
	// LastRunError says what went wrong on any of them ("" when none).
	LastRunVolumes int32  `json:"lastRunVolumes,omitempty"`
	LastRunError   string `json:"lastRunError,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RecurringJob takes snapshots or backups of a group of volumes on a schedule
// and keeps the newest Retain of them.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rj,categories=strata
// +kubebuilder:printcolumn:name="Task",type=string,JSONPath=`.spec.task`
// +kubebuilder:printcolumn:name="Cron",type=string,JSONPath=`.spec.cron`
// +kubebuilder:printcolumn:name="Retain",type=integer,JSONPath=`.spec.retain`
// +kubebuilder:printcolumn:name="LastRun",type=date,JSONPath=`.status.lastRunAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RecurringJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   RecurringJobSpec   `json:"spec"`
	Status RecurringJobStatus `json:"status,omitempty"`
}

// RecurringJobList is a list of recurring jobs.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type RecurringJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RecurringJob `json:"items"`
}
