// Package admissiontest sends admission requests through an admission.Handler
// the way the API server does: the mutating answer's JSON patch is applied to
// the raw object with the API server's own JSON-patch library, and the
// validating answer is read as the denial a client would see.
package admissiontest

import (
	"encoding/json"
	"sort"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/webhook/admission"
)

// Namespace is where the test objects live.
const Namespace = "strata-system"

// Manager is the manager ServiceAccount's username; Admin is anyone else.
const (
	Manager = "system:serviceaccount:strata-system:strata-manager"
	Admin   = "strata-admin"
)

// NewHandler builds a handler for one resource's mutator and validator.
func NewHandler(t *testing.T, m admission.Mutator, v admission.Validator) *admission.Handler {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	var ms []admission.Mutator
	var vs []admission.Validator
	if m != nil {
		ms = append(ms, m)
	}
	if v != nil {
		vs = append(vs, v)
	}
	h, err := admission.NewHandler(log, Namespace, ms, vs)
	require.NoError(t, err)
	return h
}

// Request builds a CREATE (old == nil) or UPDATE request for obj from user.
func Request(res admission.Resource, user string, old, obj runtime.Object) *admissionv1.AdmissionRequest {
	op := admissionv1.Create
	if old != nil {
		op = admissionv1.Update
	}
	meta := obj.(metav1.Object)
	req := &admissionv1.AdmissionRequest{
		UID:       types.UID("req-" + meta.GetName()),
		Kind:      metav1.GroupVersionKind{Group: res.Group, Version: res.Version, Kind: res.Kind},
		Resource:  metav1.GroupVersionResource{Group: res.Group, Version: res.Version, Resource: res.Resource},
		Name:      meta.GetName(),
		Namespace: meta.GetNamespace(),
		Operation: op,
		UserInfo:  authenticationv1.UserInfo{Username: user},
		Object:    raw(obj),
	}
	if old != nil {
		req.OldObject = raw(old)
	}
	return req
}

// Mutate sends req through h.Mutate and, when it is allowed, applies the
// patch to the raw object and decodes the result into a new object of res.
func Mutate(t *testing.T, h *admission.Handler, res admission.Resource,
	req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, runtime.Object) {
	t.Helper()
	resp := h.Mutate(req)
	if !resp.Allowed {
		return resp, nil
	}
	doc := req.Object.Raw
	if len(resp.Patch) > 0 {
		require.NotNil(t, resp.PatchType)
		require.Equal(t, admissionv1.PatchTypeJSONPatch, *resp.PatchType)
		patch, err := jsonpatch.DecodePatch(resp.Patch)
		require.NoError(t, err)
		doc, err = patch.Apply(doc)
		require.NoError(t, err, "the patch %s applies to %s", resp.Patch, req.Object.Raw)
	}
	out := res.NewObject()
	require.NoError(t, json.Unmarshal(doc, out))
	return resp, out
}

// Denial is the message a client sees for a denied response, "" if allowed.
func Denial(resp *admissionv1.AdmissionResponse) string {
	if resp.Allowed {
		return ""
	}
	if resp.Result == nil {
		return "denied without a result"
	}
	return resp.Result.Message
}

func raw(obj runtime.Object) runtime.RawExtension {
	b, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	return runtime.RawExtension{Raw: b}
}

// SortedPatch is the JSON patch with its operations sorted by path, to
// compare with an expected patch: the order of operations on different
// object members is not meaningful.
func SortedPatch(t *testing.T, patch []byte) string {
	t.Helper()
	var ops []map[string]any
	require.NoError(t, json.Unmarshal(patch, &ops))
	sort.SliceStable(ops, func(i, j int) bool { return ops[i]["path"].(string) < ops[j]["path"].(string) })
	out, err := json.Marshal(ops)
	require.NoError(t, err)
	return string(out)
}
