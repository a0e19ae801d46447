// Package backingimage holds the BackingImage admission rules: the source
// is checked when the image is created and never changes after; a copy a
// replica uses cannot be evicted; an image a volume uses cannot be deleted.
package backingimage

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/accessreview"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
)

// Resource is strata.io/v1beta1 backingimages.
var Resource = admission.Resource{
	GroupResource: v1beta1.Resource("backingimages"),
	Version:       v1beta1.SchemeGroupVersion.Version,
	Kind:          "BackingImage",
	NewObject:     func() runtime.Object { return &v1beta1.BackingImage{} },
}

var (
	specPath       = field.NewPath("spec")
	sourceTypePath = specPath.Child("sourceType")
	paramsPath     = specPath.Child("sourceParameters")
	checksumPath   = specPath.Child("checksum")
	diskFilesPath  = specPath.Child("diskFileSpecMap")
)

// sourceParameters are the parameters each source type takes; the first
// ones listed are required.
var sourceParameters = map[v1beta1.BackingImageSourceType]struct{ required, optional []string }{
	v1beta1.BackingImageSourceTypeDownload:         {required: []string{v1beta1.BackingImageParameterURL}},
	v1beta1.BackingImageSourceTypeUpload:           {},
	v1beta1.BackingImageSourceTypeExportFromVolume: {required: []string{v1beta1.BackingImageParameterVolumeName}, optional: []string{v1beta1.BackingImageParameterExportType}},
}

type validator struct {
	ds *datastore.DataStore
}

// NewValidator returns the BackingImage validator, which judges deletions too.
func NewValidator(ds *datastore.DataStore) admission.DeleteValidator { return &validator{ds: ds} }

func (v *validator) Resource() admission.Resource { return Resource }

func (v *validator) Create(req *admission.Request, obj runtime.Object) error {
	bi := obj.(*v1beta1.BackingImage)
	var errs admission.FieldErrors
	errs.Add(v.validSource(bi)...)
	if bi.Spec.SourceType == v1beta1.BackingImageSourceTypeExportFromVolume {
		errs.Add(v.mayReadVolume(req, bi.Namespace, bi.Spec.SourceParameters[v1beta1.BackingImageParameterVolumeName]))
	}
	errs.Add(validChecksum(bi.Spec.Checksum))
	return errs.Err()
}

// Update: the source is what the image's data is; changing it would leave
// copies of one image on some disks and of another on the rest.
func (v *validator) Update(_ *admission.Request, oldObj, newObj runtime.Object) error {
	old, bi := oldObj.(*v1beta1.BackingImage), newObj.(*v1beta1.BackingImage)
	var errs admission.FieldErrors
	if bi.Spec.SourceType != old.Spec.SourceType {
		errs.Add(admission.Invalid(sourceTypePath, "is immutable: cannot change from %q to %q", old.Spec.SourceType, bi.Spec.SourceType))
	}
	for _, k := range changedKeys(old.Spec.SourceParameters, bi.Spec.SourceParameters) {
		errs.Add(admission.Invalid(paramsPath.Key(k), "is immutable: cannot change from %q to %q",
			old.Spec.SourceParameters[k], bi.Spec.SourceParameters[k]))
	}
	if old.Spec.Checksum != "" && bi.Spec.Checksum != old.Spec.Checksum {
		errs.Add(admission.Invalid(checksumPath, "is immutable once set: cannot change from %s to %q", old.Spec.Checksum, bi.Spec.Checksum))
	} else if bi.Spec.Checksum != old.Spec.Checksum {
		errs.Add(validChecksum(bi.Spec.Checksum))
	}
	errs.Add(v.copiesInUse(bi.Name, old.Spec.DiskFileSpecMap, bi.Spec.DiskFileSpecMap)...)
	return errs.Err()
}

// Delete refuses while a volume is built on the image: its replicas read
// the image's file on every read of a block they have not written.
func (v *validator) Delete(_ *admission.Request, obj runtime.Object) error {
	bi := obj.(*v1beta1.BackingImage)
	if bi.DeletionTimestamp != nil {
		return nil
	}
	vols, err := v.ds.Volumes.ListByIndexRO(datastore.IndexByBackingImage, bi.Name)
	if err != nil {
		return fmt.Errorf("listing the volumes of backing image %s: %w", bi.Name, err)
	}
	var users []string
	for _, vol := range vols {
		if vol.DeletionTimestamp == nil {
			users = append(users, vol.Name)
		}
	}
	if len(users) == 0 {
		return nil
	}
	slices.Sort(users)
	return admission.Conflict("backing image %s is used by volume(s) %s; delete them first", bi.Name, strings.Join(users, ", "))
}

func (v *validator) validSource(bi *v1beta1.BackingImage) []*admission.FieldError {
	params, ok := sourceParameters[bi.Spec.SourceType]
	if !ok {
		return []*admission.FieldError{admission.Invalid(sourceTypePath, "%q is not a source type: download, upload or export-from-volume",
			bi.Spec.SourceType)}
	}
	var errs []*admission.FieldError
	for _, k := range params.required {
		if bi.Spec.SourceParameters[k] == "" {
			errs = append(errs, admission.Invalid(paramsPath.Key(k), "required for source type %s", bi.Spec.SourceType))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(bi.Spec.SourceParameters)) {
		if !slices.Contains(params.required, k) && !slices.Contains(params.optional, k) {
			errs = append(errs, admission.Invalid(paramsPath.Key(k), "unknown for source type %s (known: %s)",
				bi.Spec.SourceType, strings.Join(append(slices.Clone(params.required), params.optional...), ", ")))
		}
	}
	switch bi.Spec.SourceType {
	case v1beta1.BackingImageSourceTypeDownload:
		if u := bi.Spec.SourceParameters[v1beta1.BackingImageParameterURL]; u != "" {
			errs = append(errs, validURL(u))
		}
	case v1beta1.BackingImageSourceTypeExportFromVolume:
		errs = append(errs, v.validExport(bi.Spec.SourceParameters)...)
	}
	return errs
}

func validURL(raw string) *admission.FieldError {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return admission.Invalid(paramsPath.Key(v1beta1.BackingImageParameterURL), "%q is not a URL: %v", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return admission.Invalid(paramsPath.Key(v1beta1.BackingImageParameterURL), "%q: the scheme must be http or https", raw)
	case u.Host == "":
		return admission.Invalid(paramsPath.Key(v1beta1.BackingImageParameterURL), "%q names no host", raw)
	}
	return nil
}

func (v *validator) validExport(params map[string]string) []*admission.FieldError {
	var errs []*admission.FieldError
	if t := params[v1beta1.BackingImageParameterExportType]; t != "" &&
		t != v1beta1.BackingImageExportTypeRaw && t != v1beta1.BackingImageExportTypeQCOW2 {
		errs = append(errs, admission.Invalid(paramsPath.Key(v1beta1.BackingImageParameterExportType), "%q: raw or qcow2", t))
	}
	name := params[v1beta1.BackingImageParameterVolumeName]
	if name == "" {
		return errs
	}
	vol, err := v.ds.Volumes.GetROOrLive(context.Background(), name)
	switch {
	case apierrors.IsNotFound(err):
		errs = append(errs, admission.Invalid(paramsPath.Key(v1beta1.BackingImageParameterVolumeName), "volume %q not found", name))
	case err != nil:
		errs = append(errs, admission.Invalid(paramsPath.Key(v1beta1.BackingImageParameterVolumeName), "cannot look up volume %q: %v", name, err))
	case vol.DeletionTimestamp != nil:
		errs = append(errs, admission.Invalid(paramsPath.Key(v1beta1.BackingImageParameterVolumeName), "volume %q is being deleted", name))
	}
	return errs
}

// mayReadVolume asks, as the requester (a SubjectAccessReview), whether
// they may get the volume an image is exported from: the image is a copy
// of its data that anyone with get on backing images can download, so
// create on backing images alone must not read any volume (issue 46). A
// review that cannot be made refuses.
func (v *validator) mayReadVolume(req *admission.Request, namespace, volume string) *admission.FieldError {
	if volume == "" {
		return nil // validExport says it is missing
	}
	path := paramsPath.Key(v1beta1.BackingImageParameterVolumeName)
	ui := req.UserInfo
	sar := accessreview.For(ui.Username, ui.UID, ui.Groups, ui.Extra, authorizationv1.SubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "get",
			Group: v1beta1.SchemeGroupVersion.Group, Version: v1beta1.SchemeGroupVersion.Version,
			Resource: "volumes", Name: volume}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := v.ds.KubeClient.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	switch {
	case err != nil:
		return admission.Forbidden(path, "cannot check whether %s may get volume %q: %v", req.UserInfo.Username, volume, err)
	case !res.Status.Allowed:
		return admission.Forbidden(path, "%s may not get volumes.strata.io %q: an image exported from a volume is a copy of its data",
			req.UserInfo.Username, volume)
	}
	return nil
}

// validChecksum gives the schema's rule a message that says what is wanted.
func validChecksum(sum string) *admission.FieldError {
	if sum == "" {
		return nil
	}
	if len(sum) != 128 || strings.Trim(sum, "0123456789abcdef") != "" {
		return admission.Invalid(checksumPath, "must be the SHA-512 of the image's raw data as 128 lowercase hex digits, got %d characters", len(sum))
	}
	return nil
}

// copiesInUse refuses to evict or drop the copy on a disk that a replica of
// a volume on the image uses: the replica reads it.
func (v *validator) copiesInUse(image string, old, cur map[string]*v1beta1.BackingImageDiskFileSpec) []*admission.FieldError {
	var errs []*admission.FieldError
	for _, disk := range slices.Sorted(maps.Keys(old)) {
		spec, kept := cur[disk]
		evicting := kept && spec != nil && spec.EvictionRequested && (old[disk] == nil || !old[disk].EvictionRequested)
		if kept && !evicting {
			continue
		}
		users, err := v.ds.ImageUsersOnDisk(image, disk)
		if err != nil {
			errs = append(errs, admission.Invalid(diskFilesPath.Key(disk), "cannot list the replicas on the disk: %v", err))
			continue
		}
		if len(users) > 0 {
			errs = append(errs, admission.Invalid(diskFilesPath.Key(disk), "the copy on this disk is used by replica(s) %s; "+
				"it can go once they have moved or their volumes are deleted", strings.Join(users, ", ")))
		}
	}
	return errs
}

func changedKeys(a, b map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if b[k] != a[k] {
			out = append(out, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}
