package admission

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"sort"

	"github.com/sirupsen/logrus"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Paths the handler serves.
const (
	MutatePath   = "/v1/mutate"
	ValidatePath = "/v1/validate"
)

// maxRequestBytes bounds an AdmissionReview body: the API server's own limit
// on an object is 3 MiB, and a review carries the object and its old version.
const maxRequestBytes = 8 << 20

// Handler dispatches admission requests to the mutators and validators of
// the requested resource. Requests for a resource nobody handles, and
// operations other than CREATE and UPDATE (and DELETE, for a
// DeleteValidator), are allowed unchanged.
type Handler struct {
	log        logrus.FieldLogger
	namespace  string
	mutators   map[schema.GroupResource]Mutator
	validators map[schema.GroupResource]Validator
}

// NewHandler registers one mutator and one validator per resource at most.
// Objects must live in namespace: a validator denies creating one elsewhere,
// where no manager would ever see it.
func NewHandler(log logrus.FieldLogger, namespace string, mutators []Mutator, validators []Validator) (*Handler, error) {
	if log == nil {
		log = logrus.StandardLogger()
	}
	h := &Handler{log: log, namespace: namespace,
		mutators: map[schema.GroupResource]Mutator{}, validators: map[schema.GroupResource]Validator{}}
	for _, m := range mutators {
		gr := m.Resource().GroupResource
		if _, dup := h.mutators[gr]; dup {
			return nil, fmt.Errorf("two mutators for %s", gr)
		}
		h.mutators[gr] = m
	}
	for _, v := range validators {
		gr := v.Resource().GroupResource
		if _, dup := h.validators[gr]; dup {
			return nil, fmt.Errorf("two validators for %s", gr)
		}
		h.validators[gr] = v
	}
	return h, nil
}

// Rules lists, sorted by group and name, the resources that have a mutator
// (mutating) or a validator, with the operations handled: what the webhook
// configurations match. DELETE is matched only for a DeleteValidator, so
// deleting other kinds never waits for the webhook.
func (h *Handler) Rules(mutating bool) []Rule {
	createUpdate := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	var out []Rule
	if mutating {
		for _, m := range h.mutators {
			out = append(out, Rule{Resource: m.Resource(), Operations: createUpdate})
		}
	} else {
		for _, v := range h.validators {
			if o, ok := v.(OptionalValidator); ok && !o.Installed() {
				continue
			}
			ops := createUpdate
			if v.Resource().CreateOnly {
				ops = ops[:1]
			}
			if _, ok := v.(DeleteValidator); ok {
				ops = append(ops[:len(ops):len(ops)], admissionregistrationv1.Delete)
			}
			out = append(out, Rule{Resource: v.Resource(), Operations: ops})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// ServeMux serves MutatePath and ValidatePath, and /healthz.
func (h *Handler) ServeMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc(MutatePath, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, h.Mutate) })
	mux.HandleFunc(ValidatePath, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, h.Validate) })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	return mux
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request,
	admit func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse) {
	if r.Method != http.MethodPost {
		http.Error(w, "admission reviews are POSTed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
	if err != nil {
		http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxRequestBytes {
		http.Error(w, "admission review larger than 8 MiB", http.StatusRequestEntityTooLarge)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		http.Error(w, "decoding the AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	if gv := review.GroupVersionKind(); gv.GroupVersion() != admissionv1.SchemeGroupVersion || gv.Kind != "AdmissionReview" {
		http.Error(w, fmt.Sprintf("want an %s AdmissionReview, got %s", admissionv1.SchemeGroupVersion, gv), http.StatusBadRequest)
		return
	}
	if review.Request == nil {
		http.Error(w, "the AdmissionReview has no request", http.StatusBadRequest)
		return
	}
	resp := admit(review.Request)
	resp.UID = review.Request.UID
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		http.Error(w, "encoding the response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// Mutate answers one request with the patch of the resource's mutator.
func (h *Handler) Mutate(ar *admissionv1.AdmissionRequest) (resp *admissionv1.AdmissionResponse) {
	m, ok := h.mutators[schema.GroupResource{Group: ar.Resource.Group, Resource: ar.Resource.Resource}]
	if !ok || ar.SubResource != "" || (ar.Operation != admissionv1.Create && ar.Operation != admissionv1.Update) {
		return allowed()
	}
	res := m.Resource()
	log := h.requestLog(ar, "mutate")
	defer h.recoverInto(&resp, log, res, ar.Name)

	req := &Request{AdmissionRequest: ar}
	obj := res.NewObject()
	if err := json.Unmarshal(ar.Object.Raw, obj); err != nil {
		// A value of the wrong type: the CRD schema, checked after the
		// mutators, rejects it with a better message than ours.
		log.WithError(err).Debug("Object does not decode; leaving it to schema validation")
		return allowed()
	}
	original, err := json.Marshal(obj)
	if err != nil {
		return denied(err, res, ar.Name)
	}
	switch ar.Operation {
	case admissionv1.Create:
		err = m.Create(req, obj)
	case admissionv1.Update:
		old := res.NewObject()
		if err := json.Unmarshal(ar.OldObject.Raw, old); err != nil {
			return denied(fmt.Errorf("decoding the stored %s: %w", res.Kind, err), res, ar.Name)
		}
		err = m.Update(req, old, obj)
	}
	if err != nil {
		log.WithError(err).Info("Denied")
		return denied(err, res, ar.Name)
	}
	ops, err := createPatch(original, obj)
	if err != nil {
		return denied(err, res, ar.Name)
	}
	resp = allowed()
	if len(ops) > 0 {
		if resp.Patch, err = json.Marshal(ops); err != nil {
			return denied(err, res, ar.Name)
		}
		pt := admissionv1.PatchTypeJSONPatch
		resp.PatchType = &pt
		log.WithField("patch", string(resp.Patch)).Debug("Mutated")
	}
	return resp
}

// Validate answers one request with the verdict of the resource's validator.
func (h *Handler) Validate(ar *admissionv1.AdmissionRequest) (resp *admissionv1.AdmissionResponse) {
	v, ok := h.validators[schema.GroupResource{Group: ar.Resource.Group, Resource: ar.Resource.Resource}]
	if !ok || ar.SubResource != "" || !validatedOperation(v, ar.Operation) {
		return allowed()
	}
	res := v.Resource()
	log := h.requestLog(ar, "validate")
	defer h.recoverInto(&resp, log, res, ar.Name)

	req := &Request{AdmissionRequest: ar}
	if ar.Operation == admissionv1.Delete {
		// A DELETE carries no new object, only the stored one.
		old := res.NewObject()
		if err := json.Unmarshal(ar.OldObject.Raw, old); err != nil {
			return denied(fmt.Errorf("decoding the stored %s: %w", res.Kind, err), res, ar.Name)
		}
		if err := v.(DeleteValidator).Delete(req, old); err != nil {
			log.WithError(err).Info("Denied")
			return denied(err, res, ar.Name)
		}
		return allowed()
	}
	obj := res.NewObject()
	if err := json.Unmarshal(ar.Object.Raw, obj); err != nil {
		return denied(fmt.Errorf("decoding the %s: %w", res.Kind, err), res, ar.Name)
	}
	var err error
	switch ar.Operation {
	case admissionv1.Create:
		if ar.Namespace != h.namespace && !res.AnyNamespace {
			err = Invalid(field.NewPath("metadata", "namespace"), "%s objects live in namespace %s, not %q",
				res.Kind, h.namespace, ar.Namespace)
		} else {
			err = v.Create(req, obj)
		}
	case admissionv1.Update:
		old := res.NewObject()
		if err := json.Unmarshal(ar.OldObject.Raw, old); err != nil {
			return denied(fmt.Errorf("decoding the stored %s: %w", res.Kind, err), res, ar.Name)
		}
		err = v.Update(req, old, obj)
	}
	if err != nil {
		log.WithError(err).Info("Denied")
		return denied(err, res, ar.Name)
	}
	return allowed()
}

// recoverInto turns a handler's panic into a denial: a bug must cost one
// request, never the manager.
func (h *Handler) recoverInto(resp **admissionv1.AdmissionResponse, log logrus.FieldLogger, res Resource, name string) {
	if r := recover(); r != nil {
		log.WithField("panic", r).Errorf("Admission handler panicked\n%s", debug.Stack())
		*resp = denied(fmt.Errorf("the %s admission handler failed: %v", res.Kind, r), res, name)
	}
}

func (h *Handler) requestLog(ar *admissionv1.AdmissionRequest, what string) logrus.FieldLogger {
	return h.log.WithFields(logrus.Fields{"webhook": what, "operation": ar.Operation,
		"resource": ar.Resource.Resource, "name": ar.Name, "user": ar.UserInfo.Username})
}

func validatedOperation(v Validator, op admissionv1.Operation) bool {
	if op == admissionv1.Delete {
		_, ok := v.(DeleteValidator)
		return ok
	}
	return op == admissionv1.Create || op == admissionv1.Update
}

func allowed() *admissionv1.AdmissionResponse { return &admissionv1.AdmissionResponse{Allowed: true} }

func denied(err error, res Resource, name string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Allowed: false, Result: deniedStatus(err, res, name)}
}
