package csi

import (
	"context"
	"net/url"
	"regexp"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// backingImageParams are a StorageClass's backingImage* parameters.
type backingImageParams struct {
	name, url, checksum string
}

var sha512Hex = regexp.MustCompile(`^[a-f0-9]{128}$`)

// check refuses parameters that cannot work, naming the parameter.
func (p backingImageParams) check() error {
	if p.name == "" {
		if p.url != "" || p.checksum != "" {
			return status.Errorf(codes.InvalidArgument, "parameter %s: required when %s or %s is given",
				ParamBackingImage, ParamBackingImageURL, ParamBackingImageChecksum)
		}
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(p.name); len(errs) > 0 {
		return status.Errorf(codes.InvalidArgument, "parameter %s=%q: not a valid object name: %s", ParamBackingImage, p.name, errs[0])
	}
	if p.url != "" {
		if u, err := url.Parse(p.url); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return status.Errorf(codes.InvalidArgument, "parameter %s=%q: want an http or https URL", ParamBackingImageURL, p.url)
		}
	}
	if p.checksum != "" && !sha512Hex.MatchString(p.checksum) {
		return status.Errorf(codes.InvalidArgument, "parameter %s: want a SHA-512 as 128 lower-case hex digits", ParamBackingImageChecksum)
	}
	return nil
}

// resolveBackingImage puts the volume on the StorageClass's backing image,
// creating the image (a download) when it is missing and a URL is given. An
// existing image must match the URL and checksum given. A volume cloned
// from another takes the source's backing image (its layers sit on it).
func (d *Driver) resolveBackingImage(ctx context.Context, r *csi.CapacityRange, want *volumeRequest) error {
	p := want.image
	if want.sourceBackingImage != "" || want.dataSource != "" {
		if p.name != "" && p.name != want.sourceBackingImage {
			return status.Errorf(codes.InvalidArgument, "parameter %s=%q: the content source is on backing image %q; a clone keeps its source's",
				ParamBackingImage, p.name, want.sourceBackingImage)
		}
		want.image = backingImageParams{name: want.sourceBackingImage}
		return nil
	}
	if p.name == "" {
		return nil
	}
	bi, err := d.ds.BackingImages.GetROOrLive(ctx, p.name)
	if apierrors.IsNotFound(err) {
		if p.url == "" {
			return status.Errorf(codes.NotFound, "parameter %s: backing image %s does not exist, and no %s says where to fetch it",
				ParamBackingImage, p.name, ParamBackingImageURL)
		}
		bi, err = d.createBackingImage(ctx, p)
	}
	if err != nil {
		return apiStatus(err, "backing image "+p.name)
	}
	if bi.DeletionTimestamp != nil {
		return status.Errorf(codes.Unavailable, "parameter %s: backing image %s is being deleted", ParamBackingImage, p.name)
	}
	if p.url != "" && bi.Spec.SourceParameters[v1beta1.BackingImageParameterURL] != p.url {
		return status.Errorf(codes.InvalidArgument, "parameter %s=%q: backing image %s exists with source %s %q",
			ParamBackingImageURL, p.url, p.name, bi.Spec.SourceType, bi.Spec.SourceParameters[v1beta1.BackingImageParameterURL])
	}
	if have := firstNonEmpty(bi.Spec.Checksum, bi.Status.Checksum); p.checksum != "" && have != "" && have != p.checksum {
		return status.Errorf(codes.InvalidArgument, "parameter %s: backing image %s has checksum %s, not %s",
			ParamBackingImageChecksum, p.name, have, p.checksum)
	}
	if bi.Status.VirtualSize == 0 {
		// Its size is known once the first copy is fetched; a volume made
		// before could turn out too small for it.
		return status.Errorf(codes.Unavailable, "backing image %s is still being fetched (%s); its size is not known yet",
			p.name, firstNonEmpty(bi.Status.Message, "copies "+bi.Status.Copies))
	}
	return fitBackingImage(bi.Status.VirtualSize, r, want)
}

// fitBackingImage makes room for the image's data: with no capacity asked,
// the volume takes the image's virtual size; a smaller capacity is refused.
func fitBackingImage(virtualSize int64, r *csi.CapacityRange, want *volumeRequest) error {
	if virtualSize <= want.size {
		return nil
	}
	if want.sizeGiven {
		return status.Errorf(codes.OutOfRange, "capacity_range: %d bytes is smaller than backing image %s (%d bytes)",
			want.size, want.image.name, virtualSize)
	}
	size, ok := types.RoundUpToBlock(virtualSize)
	if !ok {
		return status.Errorf(codes.OutOfRange, "backing image %s has %d bytes, too large to round up to a whole block",
			want.image.name, virtualSize)
	}
	want.size = size
	if limit := r.GetLimitBytes(); limit > 0 && want.size > limit {
		return status.Errorf(codes.OutOfRange, "capacity_range: backing image %s has %d bytes, above limit_bytes %d",
			want.image.name, virtualSize, limit)
	}
	return nil
}

func (d *Driver) createBackingImage(ctx context.Context, p backingImageParams) (*v1beta1.BackingImage, error) {
	bi := &v1beta1.BackingImage{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: d.ds.Namespace},
		Spec: v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeDownload,
			SourceParameters: map[string]string{v1beta1.BackingImageParameterURL: p.url}, Checksum: p.checksum},
	}
	created, err := d.ds.BackingImages.Create(ctx, bi)
	if apierrors.IsAlreadyExists(err) {
		return d.ds.BackingImages.GetLive(ctx, p.name)
	}
	if err == nil {
		d.log.WithField("backingImage", p.name).WithField("url", p.url).Info("Created backing image")
	}
	return created, err
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
