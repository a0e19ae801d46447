// Package v1beta1 holds Strata's API types, group strata.io, version v1beta1.
//
// Sizes a user writes are resource.Quantity ("1Gi"); sizes the system reports
// in status are bytes (int64).
//
// +k8s:deepcopy-gen=package
// +groupName=strata.io
// +kubebuilder:validation:Optional
package v1beta1
