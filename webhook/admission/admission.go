// Package admission is Strata's admission webhook framework: one Mutator and
// one Validator per resource, an HTTP handler that speaks AdmissionReview v1,
// dispatches each request to the handlers of its resource, turns a mutator's
// changes into a JSON patch and a validator's FieldErrors into a denial that
// names the field.
//
// Handlers read through the datastore cache, never the API server: an
// admission request must answer within the webhook timeout (5 s).
package admission

import (
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Resource describes the kind a Mutator or Validator handles.
type Resource struct {
	// GroupResource is what admission requests carry, for example
	// strata.io/volumes.
	schema.GroupResource
	// Version is the API version the handler decodes, for example v1beta1.
	Version string
	// Kind is the object kind, for example Volume.
	Kind string
	// NewObject returns an empty object of the kind to decode into.
	NewObject func() runtime.Object
	// AnyNamespace is set for kinds that live in users' namespaces
	// (ResourceQuota, VolumeSnapshot, KubeVirt's and Harvester's kinds);
	// every other kind is confined to Strata's namespace.
	AnyNamespace bool
	// CreateOnly makes the validating rule match CREATE alone: for other
	// projects' kinds Strata judges only creation, and their controllers'
	// updates must never wait for Strata's webhook.
	CreateOnly bool
}

// Request is one admission request as the handlers see it.
type Request struct {
	*admissionv1.AdmissionRequest
}

// Username is who sends the request, for example
// system:serviceaccount:strata-system:strata-manager.
func (r *Request) Username() string { return r.UserInfo.Username }

// Mutator changes objects before they are stored. Create and Update change
// obj (newObj) in place: the framework compares it with what was sent and
// answers with the JSON patch between the two. An error denies the request.
type Mutator interface {
	Resource() Resource
	Create(req *Request, obj runtime.Object) error
	Update(req *Request, oldObj, newObj runtime.Object) error
}

// Validator decides whether an object may be stored; it sees the object as
// the mutators left it. It returns nil to allow, or FieldErrors to deny.
type Validator interface {
	Resource() Resource
	Create(req *Request, obj runtime.Object) error
	Update(req *Request, oldObj, newObj runtime.Object) error
}

// DeleteValidator is a Validator that also decides whether an object may be
// deleted; its resource's validating rule then matches DELETE too. Delete
// sees the object as stored (the request's oldObject) and returns nil to
// allow, or a FieldError or Conflict to deny.
type DeleteValidator interface {
	Validator
	Delete(req *Request, obj runtime.Object) error
}

// OptionalValidator is a Validator of a kind another project installs
// (KubeVirt's VirtualMachineSnapshot, Harvester's VirtualMachineBackup): its
// rule is in the webhook configuration only while Installed says the kind's
// CRD exists, since the API server refuses nothing for a missing kind and an
// admin may install it after Strata.
type OptionalValidator interface {
	Validator
	Installed() bool
}

// Rule is what a webhook configuration matches for one resource.
type Rule struct {
	Resource
	Operations []admissionregistrationv1.OperationType
}
