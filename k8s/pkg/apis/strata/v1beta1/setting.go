package v1beta1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// SettingStatus is the observed state of a setting.
type SettingStatus struct {
	// No omitempty: a rejected value must show APPLIED false, not a blank
	// column. The default fills it in objects stored without it.

	// Applied is true once the managers use the current value, false while
	// they reject it (Message says why).
	// +kubebuilder:default=false
	Applied bool `json:"applied"`
	// Message says why the value is not applied, if it is not.
	Message string `json:"message,omitempty"`
}

// Setting is one named, cluster-wide configuration value. The managers create
// every known setting with its default at start if it is missing.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sset,categories=strata
// +kubebuilder:printcolumn:name="Value",type=string,JSONPath=`.value`
// +kubebuilder:printcolumn:name="Applied",type=boolean,JSONPath=`.status.applied`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Setting struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Value of the setting, as a string; its meaning depends on the setting's name.
	// +kubebuilder:validation:Required
	Value  string        `json:"value"`
	Status SettingStatus `json:"status,omitempty"`
}

// SettingList is a list of settings.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type SettingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Setting `json:"items"`
}
