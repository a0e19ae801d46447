package api

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The backing-image seed's actions: create, delete, list, get and
// backingImageCleanup of named disks (the webhook refuses to remove a copy
// a replica uses). Uploads are api/server.go's.
func backingImageRoutes() []route {
	return []route{
		{method: http.MethodGet, path: "/v1/backingimages", serve: backingImages.list},
		{method: http.MethodPost, path: "/v1/backingimages", serve: (*call).createBackingImage},
		{method: http.MethodGet, path: "/v1/backingimages/{name}", serve: backingImages.get},
		{method: http.MethodDelete, path: "/v1/backingimages/{name}", serve: backingImages.delete},
		{method: http.MethodGet, path: "/v1/backingimages/{name}/download", serve: (*call).downloadBackingImage},
		{method: http.MethodPost, path: "/v1/backingimages/{name}", actions: map[string]func(*call) error{
			"backingImageCleanup": (*call).cleanupBackingImage,
		}},
	}
}

// backingImageRequest is the body of a create.
type backingImageRequest struct {
	Name              string `json:"name"`
	SourceType        string `json:"sourceType"`
	URL               string `json:"url"`
	Volume            string `json:"volume"`
	ExportType        string `json:"exportType"`
	Checksum          string `json:"checksum"`
	MinNumberOfCopies int32  `json:"minNumberOfCopies"`
}

func (req backingImageRequest) image(namespace string) (*v1beta1.BackingImage, error) {
	if err := checkName(req.Name, true); err != nil {
		return nil, err
	}
	params := map[string]string{}
	switch v1beta1.BackingImageSourceType(req.SourceType) {
	case v1beta1.BackingImageSourceTypeDownload:
		if !strings.HasPrefix(req.URL, "http://") && !strings.HasPrefix(req.URL, "https://") {
			return nil, badInput("url", "%q: a download needs an http:// or https:// URL", req.URL)
		}
		params[v1beta1.BackingImageParameterURL] = req.URL
	case v1beta1.BackingImageSourceTypeUpload:
	case v1beta1.BackingImageSourceTypeExportFromVolume:
		if req.Volume == "" {
			return nil, badInput("volume", "missing: an export names the volume")
		}
		params[v1beta1.BackingImageParameterVolumeName] = req.Volume
		if req.ExportType != "" {
			params[v1beta1.BackingImageParameterExportType] = req.ExportType
		}
	default:
		return nil, badInput("sourceType", "%q: one of download, upload, export-from-volume", req.SourceType)
	}
	if req.MinNumberOfCopies < 0 {
		return nil, badInput("minNumberOfCopies", "%d is negative", req.MinNumberOfCopies)
	}
	return &v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: namespace},
		Spec: v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceType(req.SourceType), SourceParameters: params,
			Checksum: req.Checksum, MinNumberOfCopies: req.MinNumberOfCopies}}, nil
}

func (c *call) createBackingImage() error {
	var req backingImageRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	bi, err := req.image(c.opts.Namespace)
	if err != nil {
		return err
	}
	// The image is written with the manager's rights, so the admission
	// webhook's own check sees the manager: ask here, as the caller, for
	// the right to read the volume whose data the image copies (issue 46).
	if bi.Spec.SourceType == v1beta1.BackingImageSourceTypeExportFromVolume {
		if err := c.authorize("get", "volumes", c.opts.Namespace, req.Volume); err != nil {
			return err
		}
	}
	return backingImages.create(c, bi)
}

// cleanupRequest names the disks (UUIDs) whose copies go.
type cleanupRequest struct {
	Disks []string `json:"disks"`
}

func (c *call) cleanupBackingImage() error {
	name := c.r.PathValue("name")
	var req cleanupRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	if len(req.Disks) == 0 {
		return badInput("disks", "missing: name the disks (UUIDs) whose copies to remove")
	}
	if err := c.authorize("update", "backingimages", c.opts.Namespace, name); err != nil {
		return err
	}
	strata, err := c.strata()
	if err != nil {
		return err
	}
	images := strata.StrataV1beta1().BackingImages(c.opts.Namespace)
	var updated *v1beta1.BackingImage
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		bi, err := images.Get(c.ctx(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var unknown []string
		for _, d := range req.Disks {
			if _, ok := bi.Spec.DiskFileSpecMap[d]; !ok {
				unknown = append(unknown, d)
			}
			delete(bi.Spec.DiskFileSpecMap, d)
		}
		if len(unknown) > 0 {
			slices.Sort(unknown)
			return badInput("disks", "backing image %q has no copy on %s", name, strings.Join(unknown, ", "))
		}
		// The webhook refuses to take a copy a replica still uses.
		c.stamp(bi)
		updated, err = images.Update(c.ctx(), bi, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	c.wrote(updated, name, "copies removed from "+strings.Join(req.Disks, ", "))
	return c.reply(http.StatusOK, updated)
}

// ExtentStreamType is the media type of a download: imagefile's extent
// stream (the image's size, then its data extents; holes are not sent).
const ExtentStreamType = "application/vnd.strata.extent-stream"

func (c *call) downloadBackingImage() error {
	name := c.r.PathValue("name")
	if err := c.authorize("get", "backingimages", c.opts.Namespace, name); err != nil {
		return err
	}
	if c.opts.images == nil {
		return fmt.Errorf("%w: this manager serves no backing images", ErrAuthUnavailable)
	}
	err := c.opts.images.Download(c.ctx(), name, &streamStart{c: c})
	if err != nil && c.written {
		// The headers are gone: the stream's missing end tells the client.
		c.opts.Log.WithError(err).WithField("backingImage", name).Warn("A download broke off")
		return nil
	}
	return err
}

// streamStart sends the headers of a download with its first bytes, so an
// error before any (no copy, a peer unreachable) is still a JSON error.
type streamStart struct{ c *call }

func (s *streamStart) Write(p []byte) (int, error) {
	if !s.c.written {
		s.c.written = true
		s.c.w.Header().Set("Content-Type", ExtentStreamType)
	}
	return s.c.w.Write(p)
}
