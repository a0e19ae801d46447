package admission

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// FieldError is why one field makes a request denied. Its text is
// "<field>: <message>", for example
// "spec.numberOfReplicas: 5 is more than the 3 nodes in the cluster".
type FieldError struct {
	Field   string
	Message string
	// Forbidden marks a field the requester may not write (403) rather than
	// a value that is invalid (422).
	Forbidden bool
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Invalid is a FieldError for a value that is not allowed.
func Invalid(path *field.Path, format string, args ...any) *FieldError {
	return &FieldError{Field: path.String(), Message: fmt.Sprintf(format, args...)}
}

// Forbidden is a FieldError for a field the requester may not change.
func Forbidden(path *field.Path, format string, args ...any) *FieldError {
	return &FieldError{Field: path.String(), Message: fmt.Sprintf(format, args...), Forbidden: true}
}

// ConflictError denies a request that the object's current state forbids,
// such as deleting a volume a workload holds attached: 409 Conflict, with a
// message that names what holds the object and how to release it.
type ConflictError struct {
	Message string
}

func (e *ConflictError) Error() string { return e.Message }

// Conflict is a ConflictError.
func Conflict(format string, args ...any) *ConflictError {
	return &ConflictError{Message: fmt.Sprintf(format, args...)}
}

// PolicyError denies a request a policy forbids, such as a snapshot over a
// quota: 403 Forbidden, as Kubernetes' own ResourceQuota answers.
type PolicyError struct {
	Message string
}

func (e *PolicyError) Error() string { return e.Message }

// Policy is a PolicyError.
func Policy(format string, args ...any) *PolicyError {
	return &PolicyError{Message: fmt.Sprintf(format, args...)}
}

// FieldErrors collects every reason a request is denied, so that one answer
// names them all.
type FieldErrors []*FieldError

func (e FieldErrors) Error() string {
	msgs := make([]string, len(e))
	for i, fe := range e {
		msgs[i] = fe.Error()
	}
	return strings.Join(msgs, "; ")
}

// Add appends errors, skipping nil ones.
func (e *FieldErrors) Add(errs ...*FieldError) {
	for _, fe := range errs {
		if fe != nil {
			*e = append(*e, fe)
		}
	}
}

// Err is nil when nothing was added: return it from a Validator.
func (e FieldErrors) Err() error {
	if len(e) == 0 {
		return nil
	}
	return e
}

// deniedStatus turns a handler's error into the status of the denial:
// FieldErrors are 422 Invalid (403 Forbidden when any field is forbidden)
// with one cause per field, a ConflictError is 409 Conflict; anything else
// is an internal error.
func deniedStatus(err error, res Resource, name string) *metav1.Status {
	var fes FieldErrors
	var fe *FieldError
	var ce *ConflictError
	var pe *PolicyError
	switch {
	case errors.As(err, &pe):
		return &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: pe.Message, Details: &metav1.StatusDetails{Name: name, Group: res.Group, Kind: res.Kind}}
	case errors.As(err, &ce):
		return &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: metav1.StatusReasonConflict,
			Message: ce.Message, Details: &metav1.StatusDetails{Name: name, Group: res.Group, Kind: res.Kind}}
	case errors.As(err, &fes):
	case errors.As(err, &fe):
		fes = FieldErrors{fe}
	default:
		return &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
			Reason: metav1.StatusReasonInternalError, Message: "internal error: " + err.Error()}
	}
	status := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity,
		Reason: metav1.StatusReasonInvalid, Message: fes.Error(),
		Details: &metav1.StatusDetails{Name: name, Group: res.Group, Kind: res.Kind}}
	for _, fe := range fes {
		cause := metav1.StatusCause{Type: metav1.CauseTypeFieldValueInvalid, Message: fe.Message, Field: fe.Field}
		if fe.Forbidden {
			cause.Type = metav1.CauseTypeForbidden
			status.Code, status.Reason = http.StatusForbidden, metav1.StatusReasonForbidden
		}
		status.Details.Causes = append(status.Details.Causes, cause)
	}
	return status
}

// LabelErrors refuses the keys and values of labels (at path, one entry
// per key) that Kubernetes would refuse as labels, in key order.
func LabelErrors(path *field.Path, labels map[string]string) []*FieldError {
	var errs []*FieldError
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, Invalid(path.Key(k), "invalid key %q: %s", k, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsValidLabelValue(labels[k]); len(msgs) > 0 {
			errs = append(errs, Invalid(path.Key(k), "invalid value %q: %s", labels[k], strings.Join(msgs, "; ")))
		}
	}
	return errs
}
