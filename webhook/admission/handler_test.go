package admission_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

var volumes = admission.Resource{
	GroupResource: v1beta1.Resource("volumes"), Version: "v1beta1", Kind: "Volume",
	NewObject: func() runtime.Object { return &v1beta1.Volume{} },
}

// funcs is a Mutator and a Validator made of functions.
type funcs struct {
	create func(*admission.Request, runtime.Object) error
	update func(*admission.Request, runtime.Object, runtime.Object) error
}

func (f funcs) Resource() admission.Resource { return volumes }
func (f funcs) Create(r *admission.Request, obj runtime.Object) error {
	return f.create(r, obj)
}
func (f funcs) Update(r *admission.Request, old, obj runtime.Object) error {
	return f.update(r, old, obj)
}

func onCreate(fn func(*admission.Request, runtime.Object) error) funcs {
	return funcs{create: fn, update: func(*admission.Request, runtime.Object, runtime.Object) error { return nil }}
}

func testVolume() *v1beta1.Volume {
	return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "v1", Namespace: admissiontest.Namespace},
		Spec: v1beta1.VolumeSpec{Size: resource.MustParse("1Gi")}}
}

func TestValidateTurnsErrorsIntoStatus(t *testing.T) {
	replicas := field.NewPath("spec", "numberOfReplicas")
	tests := []struct {
		name       string
		err        error
		wantCode   int32
		wantReason metav1.StatusReason
		wantMsg    string
		wantCauses []metav1.StatusCause
	}{
		{name: "one invalid field", err: admission.Invalid(replicas, "%d is too many", 5),
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantMsg: "spec.numberOfReplicas: 5 is too many",
			wantCauses: []metav1.StatusCause{{Type: metav1.CauseTypeFieldValueInvalid, Field: "spec.numberOfReplicas", Message: "5 is too many"}}},
		{name: "an invalid and a forbidden field",
			err:      admission.FieldErrors{admission.Invalid(replicas, "bad"), admission.Forbidden(field.NewPath("spec", "nodeID"), "not yours")},
			wantCode: 403, wantReason: metav1.StatusReasonForbidden, wantMsg: "spec.numberOfReplicas: bad; spec.nodeID: not yours",
			wantCauses: []metav1.StatusCause{
				{Type: metav1.CauseTypeFieldValueInvalid, Field: "spec.numberOfReplicas", Message: "bad"},
				{Type: metav1.CauseTypeForbidden, Field: "spec.nodeID", Message: "not yours"}}},
		{name: "any other error is internal", err: errors.New("cache is gone"),
			wantCode: 500, wantReason: metav1.StatusReasonInternalError, wantMsg: "internal error: cache is gone"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := admissiontest.NewHandler(t, nil, onCreate(func(*admission.Request, runtime.Object) error { return tc.err }))
			resp := h.Validate(admissiontest.Request(volumes, admissiontest.Admin, nil, testVolume()))
			require.False(t, resp.Allowed)
			assert.Equal(t, tc.wantCode, resp.Result.Code)
			assert.Equal(t, tc.wantReason, resp.Result.Reason)
			assert.Equal(t, tc.wantMsg, resp.Result.Message)
			if tc.wantCauses != nil {
				assert.Equal(t, tc.wantCauses, resp.Result.Details.Causes)
				assert.Equal(t, "v1", resp.Result.Details.Name)
			}
		})
	}
}

func TestDispatch(t *testing.T) {
	calls := 0
	deny := funcs{
		create: func(*admission.Request, runtime.Object) error {
			calls++
			return admission.Invalid(field.NewPath("x"), "no")
		},
		update: func(*admission.Request, runtime.Object, runtime.Object) error {
			calls++
			return admission.Invalid(field.NewPath("x"), "no")
		},
	}
	h := admissiontest.NewHandler(t, deny, deny)
	base := func() *admissionv1.AdmissionRequest {
		return admissiontest.Request(volumes, admissiontest.Admin, nil, testVolume())
	}
	tests := []struct {
		name        string
		req         func() *admissionv1.AdmissionRequest
		wantAllowed bool
	}{
		{"create is judged", base, false},
		{"update is judged", func() *admissionv1.AdmissionRequest {
			return admissiontest.Request(volumes, admissiontest.Admin, testVolume(), testVolume())
		}, false},
		{"delete passes", func() *admissionv1.AdmissionRequest { r := base(); r.Operation = admissionv1.Delete; return r }, true},
		{"a subresource passes", func() *admissionv1.AdmissionRequest { r := base(); r.SubResource = "status"; return r }, true},
		{"another resource passes", func() *admissionv1.AdmissionRequest { r := base(); r.Resource.Resource = "nodes"; return r }, true},
		{"another group passes", func() *admissionv1.AdmissionRequest { r := base(); r.Resource.Group = "example.com"; return r }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls = 0
			assert.Equal(t, tc.wantAllowed, h.Mutate(tc.req()).Allowed, "mutate")
			assert.Equal(t, tc.wantAllowed, h.Validate(tc.req()).Allowed, "validate")
			if tc.wantAllowed {
				assert.Zero(t, calls, "no handler ran")
			}
		})
	}
}

func TestPanicIsADenial(t *testing.T) {
	boom := onCreate(func(_ *admission.Request, obj runtime.Object) error {
		_ = obj.(*v1beta1.Engine) // the wrong type: panics
		return nil
	})
	h := admissiontest.NewHandler(t, boom, boom)
	for name, admit := range map[string]func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse{
		"mutate": h.Mutate, "validate": h.Validate} {
		t.Run(name, func(t *testing.T) {
			resp := admit(admissiontest.Request(volumes, admissiontest.Admin, nil, testVolume()))
			require.False(t, resp.Allowed)
			assert.EqualValues(t, http.StatusInternalServerError, resp.Result.Code)
			assert.Contains(t, resp.Result.Message, "internal error: the Volume admission handler failed: interface conversion")
		})
	}
}

func TestUndecodableObject(t *testing.T) {
	h := admissiontest.NewHandler(t, onCreate(func(*admission.Request, runtime.Object) error { return nil }),
		onCreate(func(*admission.Request, runtime.Object) error { return nil }))
	req := admissiontest.Request(volumes, admissiontest.Admin, nil, testVolume())
	req.Object.Raw = []byte(`{"metadata":{"name":"v1"},"spec":{"numberOfReplicas":"three"}}`)
	assert.True(t, h.Mutate(req).Allowed, "left to the CRD schema, which names the field better")
	resp := h.Validate(req)
	require.False(t, resp.Allowed)
	assert.Contains(t, resp.Result.Message, "decoding the Volume")
}

func TestMutatePatch(t *testing.T) {
	tests := []struct {
		name      string
		raw       string
		mutate    func(*v1beta1.Volume)
		wantPatch string
		want      func(*testing.T, *v1beta1.Volume)
	}{
		{name: "no change, no patch", raw: `{"metadata":{"name":"v1"},"spec":{"size":"1Gi"}}`,
			mutate: func(*v1beta1.Volume) {}},
		{name: "a field the raw object lacks is added",
			raw:       `{"metadata":{"name":"v1"},"spec":{"size":"1Gi"}}`,
			mutate:    func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 3 },
			wantPatch: `[{"op":"add","path":"/spec/numberOfReplicas","value":3}]`,
			want:      func(t *testing.T, v *v1beta1.Volume) { assert.EqualValues(t, 3, v.Spec.NumberOfReplicas) }},
		{name: "an explicit zero is replaced",
			raw:       `{"metadata":{"name":"v1"},"spec":{"size":"1Gi","numberOfReplicas":0}}`,
			mutate:    func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 2 },
			wantPatch: `[{"op":"add","path":"/spec/numberOfReplicas","value":2}]`,
			want:      func(t *testing.T, v *v1beta1.Volume) { assert.EqualValues(t, 2, v.Spec.NumberOfReplicas) }},
		{name: "a changed value is replaced in place",
			raw:       `{"metadata":{"name":"v1"},"spec":{"size":"1Gi","frontend":""}}`,
			mutate:    func(v *v1beta1.Volume) { v.Spec.Size = resource.MustParse("2Gi") },
			wantPatch: `[{"op":"add","path":"/spec/size","value":"2Gi"}]`,
			want:      func(t *testing.T, v *v1beta1.Volume) { assert.Equal(t, "2Gi", v.Spec.Size.String()) }},
		{name: "label keys are escaped",
			raw:       `{"metadata":{"name":"v1","labels":{"a":"b"}},"spec":{"size":"1Gi"}}`,
			mutate:    func(v *v1beta1.Volume) { v.Labels["strata.io/volume"] = "v1" },
			wantPatch: `[{"op":"add","path":"/metadata/labels/strata.io~1volume","value":"v1"}]`,
			want:      func(t *testing.T, v *v1beta1.Volume) { assert.Equal(t, "v1", v.Labels["strata.io/volume"]) }},
		{name: "an array element keeps replace",
			raw:       `{"metadata":{"name":"v1","finalizers":["a","b"]},"spec":{"size":"1Gi"}}`,
			mutate:    func(v *v1beta1.Volume) { v.Finalizers[1] = "c" },
			wantPatch: `[{"op":"replace","path":"/metadata/finalizers/1","value":"c"}]`,
			want:      func(t *testing.T, v *v1beta1.Volume) { assert.Equal(t, []string{"a", "c"}, v.Finalizers) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := admissiontest.NewHandler(t, onCreate(func(_ *admission.Request, obj runtime.Object) error {
				tc.mutate(obj.(*v1beta1.Volume))
				return nil
			}), nil)
			req := admissiontest.Request(volumes, admissiontest.Admin, nil, testVolume())
			req.Object.Raw = []byte(tc.raw)
			resp, obj := admissiontest.Mutate(t, h, volumes, req)
			require.True(t, resp.Allowed, admissiontest.Denial(resp))
			if tc.wantPatch == "" {
				assert.Empty(t, resp.Patch)
				assert.Nil(t, resp.PatchType)
				return
			}
			assert.JSONEq(t, tc.wantPatch, string(resp.Patch))
			tc.want(t, obj.(*v1beta1.Volume))
		})
	}
}

func TestNewHandlerRefusesTwoHandlersForOneResource(t *testing.T) {
	m := onCreate(nil)
	_, err := admission.NewHandler(nil, "ns", []admission.Mutator{m, m}, nil)
	assert.EqualError(t, err, "two mutators for volumes.strata.io")
	_, err = admission.NewHandler(nil, "ns", nil, []admission.Validator{m, m})
	assert.EqualError(t, err, "two validators for volumes.strata.io")
	h, err := admission.NewHandler(nil, "ns", []admission.Mutator{m}, nil)
	require.NoError(t, err)
	require.Len(t, h.Rules(true), 1)
	assert.Equal(t, "volumes.strata.io", h.Rules(true)[0].String())
	assert.Empty(t, h.Rules(false))
}

// deleteFuncs is a validator that also judges deletions.
type deleteFuncs struct {
	funcs
	del func(*admission.Request, runtime.Object) error
}

func (f deleteFuncs) Delete(r *admission.Request, obj runtime.Object) error { return f.del(r, obj) }

func TestRulesMatchDeleteOnlyForDeleteValidators(t *testing.T) {
	plain := onCreate(nil)
	createUpdate := []admissionregistrationv1.OperationType{"CREATE", "UPDATE"}
	h, err := admission.NewHandler(nil, "ns", []admission.Mutator{plain}, []admission.Validator{deleteFuncs{funcs: plain}})
	require.NoError(t, err)
	assert.Equal(t, createUpdate, h.Rules(true)[0].Operations, "mutators never see DELETE")
	assert.Equal(t, []admissionregistrationv1.OperationType{"CREATE", "UPDATE", "DELETE"}, h.Rules(false)[0].Operations)

	h, err = admission.NewHandler(nil, "ns", nil, []admission.Validator{plain})
	require.NoError(t, err)
	assert.Equal(t, createUpdate, h.Rules(false)[0].Operations)
}

func TestDeleteValidator(t *testing.T) {
	var seen *v1beta1.Volume
	judge := func(err error) deleteFuncs {
		return deleteFuncs{funcs: onCreate(func(*admission.Request, runtime.Object) error { return nil }),
			del: func(_ *admission.Request, obj runtime.Object) error { seen = obj.(*v1beta1.Volume); return err }}
	}
	deleteReq := func() *admissionv1.AdmissionRequest {
		// As the API server sends it: the stored object in oldObject, no object.
		r := admissiontest.Request(volumes, admissiontest.Admin, testVolume(), testVolume())
		r.Operation, r.Object = admissionv1.Delete, runtime.RawExtension{}
		return r
	}

	t.Run("allowed", func(t *testing.T) {
		seen = nil
		h := admissiontest.NewHandler(t, nil, judge(nil))
		assert.True(t, h.Validate(deleteReq()).Allowed)
		require.NotNil(t, seen, "Delete ran")
		assert.Equal(t, "1Gi", seen.Spec.Size.String(), "Delete sees the stored object")
	})
	t.Run("a conflict is 409 with the message as it is", func(t *testing.T) {
		h := admissiontest.NewHandler(t, nil, judge(admission.Conflict("volume %s is in use", "v1")))
		resp := h.Validate(deleteReq())
		require.False(t, resp.Allowed)
		assert.EqualValues(t, http.StatusConflict, resp.Result.Code)
		assert.Equal(t, metav1.StatusReasonConflict, resp.Result.Reason)
		assert.Equal(t, "volume v1 is in use", resp.Result.Message)
		assert.Equal(t, "Volume", resp.Result.Details.Kind)
	})
	t.Run("a delete outside the namespace is judged by the validator alone", func(t *testing.T) {
		h := admissiontest.NewHandler(t, nil, judge(nil))
		r := deleteReq()
		r.Namespace = "elsewhere"
		assert.True(t, h.Validate(r).Allowed)
	})
	t.Run("mutators are not asked", func(t *testing.T) {
		h := admissiontest.NewHandler(t, onCreate(func(*admission.Request, runtime.Object) error {
			return errors.New("must not run")
		}), nil)
		assert.True(t, h.Mutate(deleteReq()).Allowed)
	})
}

func TestServeHTTP(t *testing.T) {
	h := admissiontest.NewHandler(t, nil, onCreate(func(*admission.Request, runtime.Object) error {
		return admission.Invalid(field.NewPath("spec", "size"), "too small")
	}))
	srv := httptest.NewServer(h.ServeMux())
	defer srv.Close()
	review := func(apiVersion string, req *admissionv1.AdmissionRequest) []byte {
		b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: apiVersion, Kind: "AdmissionReview"},
			Request: req})
		require.NoError(t, err)
		return b
	}
	good := review("admission.k8s.io/v1", admissiontest.Request(volumes, admissiontest.Admin, nil, testVolume()))

	tests := []struct {
		name, method, path string
		body               []byte
		wantStatus         int
	}{
		{"a review is answered", http.MethodPost, admission.ValidatePath, good, http.StatusOK},
		{"GET is refused", http.MethodGet, admission.ValidatePath, nil, http.StatusMethodNotAllowed},
		{"not JSON", http.MethodPost, admission.ValidatePath, []byte("{"), http.StatusBadRequest},
		{"v1beta1 reviews are refused", http.MethodPost, admission.ValidatePath,
			review("admission.k8s.io/v1beta1", admissiontest.Request(volumes, admissiontest.Admin, nil, testVolume())), http.StatusBadRequest},
		{"a review without request", http.MethodPost, admission.MutatePath, review("admission.k8s.io/v1", nil), http.StatusBadRequest},
		{"too large", http.MethodPost, admission.MutatePath, bytes.Repeat([]byte(" "), 8<<20+1), http.StatusRequestEntityTooLarge},
		{"unknown path", http.MethodPost, "/v2/validate", good, http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, bytes.NewReader(tc.body))
			require.NoError(t, err)
			resp, err := srv.Client().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, tc.wantStatus, resp.StatusCode)
			if tc.wantStatus != http.StatusOK {
				return
			}
			var out admissionv1.AdmissionReview
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
			assert.Equal(t, "admission.k8s.io/v1", out.APIVersion)
			assert.Equal(t, "AdmissionReview", out.Kind)
			assert.EqualValues(t, "req-v1", out.Response.UID)
			assert.False(t, out.Response.Allowed)
			assert.Equal(t, "spec.size: too small", out.Response.Result.Message)
		})
	}
}
