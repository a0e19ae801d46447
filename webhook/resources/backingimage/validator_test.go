package backingimage

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

const ns = types.DefaultNamespace

func image(change func(*v1beta1.BackingImage)) *v1beta1.BackingImage {
	bi := &v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: "img", Namespace: ns},
		Spec: v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeDownload,
			SourceParameters: map[string]string{"url": "https://example.com/disk.qcow2"}}}
	if change != nil {
		change(bi)
	}
	return bi
}

func volume(name, image string, deleting bool) *v1beta1.Volume {
	v := &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1beta1.VolumeSpec{Size: resource.MustParse("1Gi"), BackingImage: image}}
	if deleting {
		v.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
		v.Finalizers = []string{types.FinalizerName}
	}
	return v
}

func replica(name, image, disk string) *v1beta1.Replica {
	return &v1beta1.Replica{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1beta1.ReplicaSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v", BackingImage: image}, DiskID: disk}}
}

var goodSum = strings.Repeat("0123456789abcdef", 8)

func params(kv ...string) func(*v1beta1.BackingImage) {
	return func(bi *v1beta1.BackingImage) {
		bi.Spec.SourceParameters = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			bi.Spec.SourceParameters[kv[i]] = kv[i+1]
		}
	}
}

func TestValidatorCreate(t *testing.T) {
	export := func(kv ...string) func(*v1beta1.BackingImage) {
		return func(bi *v1beta1.BackingImage) {
			bi.Spec.SourceType = v1beta1.BackingImageSourceTypeExportFromVolume
			params(kv...)(bi)
		}
	}
	tests := []struct {
		name    string
		obj     *v1beta1.BackingImage
		wantMsg string
	}{
		{name: "download", obj: image(nil)},
		{name: "download with a checksum", obj: image(func(bi *v1beta1.BackingImage) { bi.Spec.Checksum = goodSum })},
		{name: "download without a url", obj: image(params()),
			wantMsg: `spec.sourceParameters[url]: required for source type download`},
		{name: "an ftp url", obj: image(params("url", "ftp://example.com/x")),
			wantMsg: `spec.sourceParameters[url]: "ftp://example.com/x": the scheme must be http or https`},
		{name: "a url without a host", obj: image(params("url", "http:///x")),
			wantMsg: `spec.sourceParameters[url]: "http:///x" names no host`},
		{name: "an unknown parameter", obj: image(params("url", "http://h/x", "format", "qcow2")),
			wantMsg: `spec.sourceParameters[format]: unknown for source type download (known: url)`},
		{name: "upload", obj: image(func(bi *v1beta1.BackingImage) {
			bi.Spec.SourceType, bi.Spec.SourceParameters = v1beta1.BackingImageSourceTypeUpload, nil
		})},
		{name: "export of a volume", obj: image(export("volume-name", "src", "export-type", "qcow2"))},
		{name: "export of a missing volume", obj: image(export("volume-name", "nope")),
			wantMsg: `spec.sourceParameters[volume-name]: volume "nope" not found`},
		{name: "export of a volume being deleted", obj: image(export("volume-name", "going")),
			wantMsg: `spec.sourceParameters[volume-name]: volume "going" is being deleted`},
		{name: "export type vmdk", obj: image(export("volume-name", "src", "export-type", "vmdk")),
			wantMsg: `spec.sourceParameters[export-type]: "vmdk": raw or qcow2`},
		{name: "a checksum too short", obj: image(func(bi *v1beta1.BackingImage) { bi.Spec.Checksum = "abc" }),
			wantMsg: `spec.checksum: must be the SHA-512 of the image's raw data as 128 lowercase hex digits, got 3 characters`},
	}
	env := dstest.New(t, []runtime.Object{volume("src", "", false), volume("going", "", true)}, nil)
	allowEveryone(env)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}

// allowEveryone answers every SubjectAccessReview with allowed, but those of
// mallory (who may create backing images, not read volumes) and of broken
// (whose review fails).
func allowEveryone(env *dstest.Env) {
	env.Kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		if sar.Spec.User == "broken" {
			return true, nil, errors.New("the API server is unreachable")
		}
		sar.Status.Allowed = sar.Spec.User != "mallory"
		return true, sar, nil
	})
}

// An image exported from a volume is a copy of its data: its creator needs
// get on the volume, asked as the creator (issue 46).
func TestValidatorExportNeedsGetOnTheVolume(t *testing.T) {
	export := image(func(bi *v1beta1.BackingImage) {
		bi.Spec.SourceType = v1beta1.BackingImageSourceTypeExportFromVolume
		params("volume-name", "src")(bi)
	})
	tests := []struct {
		user, wantMsg string
	}{
		{user: admissiontest.Admin},
		{user: "mallory", wantMsg: `spec.sourceParameters[volume-name]: mallory may not get volumes.strata.io "src": ` +
			`an image exported from a volume is a copy of its data`},
		{user: "broken", wantMsg: `spec.sourceParameters[volume-name]: cannot check whether broken may get volume "src": ` +
			`the API server is unreachable`},
	}
	env := dstest.New(t, []runtime.Object{volume("src", "", false)}, nil)
	allowEveryone(env)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.user, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, tc.user, nil, export))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
			if tc.wantMsg != "" {
				assert.EqualValues(t, http.StatusForbidden, resp.Result.Code)
			}
		})
	}
	var asked []string
	for _, a := range env.Kube.Actions() {
		if c, ok := a.(k8stesting.CreateAction); ok && a.GetResource().Resource == "subjectaccessreviews" {
			ra := c.GetObject().(*authorizationv1.SubjectAccessReview).Spec.ResourceAttributes
			asked = append(asked, ra.Verb+" "+ra.Resource+"."+ra.Group+" "+ra.Namespace+"/"+ra.Name)
		}
	}
	assert.Equal(t, []string{"get volumes.strata.io " + ns + "/src", "get volumes.strata.io " + ns + "/src",
		"get volumes.strata.io " + ns + "/src"}, asked)
}

func TestValidatorUpdate(t *testing.T) {
	withDisks := func(disks map[string]*v1beta1.BackingImageDiskFileSpec) func(*v1beta1.BackingImage) {
		return func(bi *v1beta1.BackingImage) { bi.Spec.DiskFileSpecMap = disks }
	}
	twoDisks := map[string]*v1beta1.BackingImageDiskFileSpec{"disk-used": {}, "disk-free": {}}
	tests := []struct {
		name     string
		old, obj *v1beta1.BackingImage
		wantMsg  string
	}{
		{name: "the url changes", old: image(nil), obj: image(params("url", "https://other/x")),
			wantMsg: `spec.sourceParameters[url]: is immutable: cannot change from "https://example.com/disk.qcow2" to "https://other/x"`},
		{name: "the source type changes", old: image(nil), obj: image(func(bi *v1beta1.BackingImage) {
			bi.Spec.SourceType = v1beta1.BackingImageSourceTypeUpload
		}), wantMsg: `spec.sourceType: is immutable: cannot change from "download" to "upload"`},
		{name: "a checksum set later", old: image(nil), obj: image(func(bi *v1beta1.BackingImage) { bi.Spec.Checksum = goodSum })},
		{name: "the checksum changes", old: image(func(bi *v1beta1.BackingImage) { bi.Spec.Checksum = goodSum }),
			obj:     image(func(bi *v1beta1.BackingImage) { bi.Spec.Checksum = strings.Repeat("f", 128) }),
			wantMsg: `spec.checksum: is immutable once set: cannot change from ` + goodSum + ` to "` + strings.Repeat("f", 128) + `"`},
		{name: "an unused copy dropped", old: image(withDisks(twoDisks)),
			obj: image(withDisks(map[string]*v1beta1.BackingImageDiskFileSpec{"disk-used": {}}))},
		{name: "an unused copy evicted", old: image(withDisks(twoDisks)),
			obj: image(withDisks(map[string]*v1beta1.BackingImageDiskFileSpec{"disk-used": {}, "disk-free": {EvictionRequested: true}}))},
		{name: "a used copy dropped", old: image(withDisks(twoDisks)),
			obj: image(withDisks(map[string]*v1beta1.BackingImageDiskFileSpec{"disk-free": {}})),
			wantMsg: `spec.diskFileSpecMap[disk-used]: the copy on this disk is used by replica(s) r1, r2; ` +
				`it can go once they have moved or their volumes are deleted`},
		{name: "a used copy evicted", old: image(withDisks(twoDisks)),
			obj: image(withDisks(map[string]*v1beta1.BackingImageDiskFileSpec{"disk-used": {EvictionRequested: true}, "disk-free": {}})),
			wantMsg: `spec.diskFileSpecMap[disk-used]: the copy on this disk is used by replica(s) r1, r2; ` +
				`it can go once they have moved or their volumes are deleted`},
		{name: "a disk added", old: image(nil), obj: image(withDisks(twoDisks))},
	}
	env := dstest.New(t, []runtime.Object{replica("r1", "img", "disk-used"), replica("r2", "img", "disk-used"),
		replica("r3", "other", "disk-free")}, nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, tc.old, tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
		})
	}
}

func TestValidatorDelete(t *testing.T) {
	deleteRequest := func(bi *v1beta1.BackingImage) *admissionv1.AdmissionRequest {
		req := admissiontest.Request(Resource, admissiontest.Admin, bi, bi)
		req.Operation, req.Object = admissionv1.Delete, runtime.RawExtension{}
		return req
	}
	named := func(name string) *v1beta1.BackingImage {
		return image(func(bi *v1beta1.BackingImage) { bi.Name = name })
	}
	tests := []struct {
		name    string
		obj     *v1beta1.BackingImage
		wantMsg string
	}{
		{name: "used by two volumes", obj: named("img"), wantMsg: "backing image img is used by volume(s) v1, v2; delete them first"},
		{name: "used only by a volume being deleted", obj: named("leaving")},
		{name: "unused", obj: named("free")},
	}
	env := dstest.New(t, []runtime.Object{volume("v2", "img", false), volume("v1", "img", false),
		volume("v3", "leaving", true)}, nil)
	h := admissiontest.NewHandler(t, nil, NewValidator(env.DS))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.Validate(deleteRequest(tc.obj))
			assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp))
			if tc.wantMsg != "" {
				require.NotNil(t, resp.Result)
				assert.EqualValues(t, http.StatusConflict, resp.Result.Code)
			}
		})
	}
}
