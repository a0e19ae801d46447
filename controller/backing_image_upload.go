package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Errors of the HTTP endpoints, for the API to map to status codes.
var (
	ErrImageNotFound = errors.New("not found")
	ErrImageConflict = errors.New("conflict")
	ErrImageNotReady = errors.New("not ready")
	ErrImageTooLarge = errors.New("too large")
)

// CopyFile returns the path of the image's ready copy on disk, a disk of
// this node, for a peer to fetch. uuid must be the image's: a peer with a
// stale view never gets the file of an earlier image of the same name.
func (c *BackingImageController) CopyFile(image, disk, uuid string) (string, error) {
	bi, err := c.ds.BackingImages.GetRO(image)
	if err != nil {
		return "", fmt.Errorf("backing image %s: %w", image, ErrImageNotFound)
	}
	if bi.Status.UUID == "" || bi.Status.UUID != uuid {
		return "", fmt.Errorf("backing image %s has UUID %q, not %q: %w", image, bi.Status.UUID, uuid, ErrImageNotFound)
	}
	path, ok := c.localDiskPath(disk)
	if !ok {
		return "", fmt.Errorf("disk %s is not on node %s: %w", disk, c.controllerID, ErrImageNotFound)
	}
	if !c.files.isVerified(fileJobKey{bi.UID, disk}) {
		return "", fmt.Errorf("the copy of %s on disk %s is not ready: %w", image, disk, ErrImageNotReady)
	}
	return BackingImageFile(path, bi), nil
}

// localDiskPath is the path of this node's disk with the given UUID.
func (c *BackingImageController) localDiskPath(disk string) (string, bool) {
	loc, ok := c.ds.LocateDisk(disk)
	if !ok || loc.Node != c.controllerID {
		return "", false
	}
	return loc.Path, true
}

// Upload receives an upload-type image's data, streamed, onto one of this
// node's disks (the one with the most room), prepares it like a download
// (format detection, conversion, checksum) and makes that disk the image's
// first copy; the other wanted disks then copy from it. size is the
// request's Content-Length (-1: unknown); more than the upload limit is
// refused before and while reading.
func (c *BackingImageController) Upload(ctx context.Context, image string, body io.Reader, size int64) (imagefile.Result, error) {
	var res imagefile.Result
	bi, err := c.ds.BackingImages.GetROOrLive(ctx, image)
	if apierrors.IsNotFound(err) {
		return res, fmt.Errorf("backing image %s does not exist: %w", image, ErrImageNotFound)
	}
	if err != nil {
		return res, err
	}
	switch {
	case bi.Spec.SourceType != v1beta1.BackingImageSourceTypeUpload:
		return res, fmt.Errorf("backing image %s has sourceType %s, not upload: %w", image, bi.Spec.SourceType, ErrImageConflict)
	case bi.DeletionTimestamp != nil:
		return res, fmt.Errorf("backing image %s is being deleted: %w", image, ErrImageConflict)
	case len(readyCopies(bi)) > 0:
		return res, fmt.Errorf("backing image %s already holds its data; create another image for other data: %w", image, ErrImageConflict)
	case bi.Status.UUID == "":
		return res, fmt.Errorf("backing image %s is not initialised yet; try again in a moment: %w", image, ErrImageNotReady)
	case size > c.uploadLimit:
		return res, fmt.Errorf("the upload is %d bytes, more than this manager accepts (%d, --upload-size-limit): %w", size, c.uploadLimit, ErrImageTooLarge)
	}
	disk, diskPath, err := c.uploadDisk()
	if err != nil {
		return res, err
	}
	k := fileJobKey{bi.UID, disk}
	if _, running := c.files.get(k); running {
		return res, fmt.Errorf("an upload of %s onto disk %s is already running: %w", image, disk, ErrImageConflict)
	}
	if err := c.claimUploadDisk(ctx, image, disk); err != nil {
		return res, err
	}
	dir := BackingImageDir(diskPath, bi.Name, bi.Status.UUID)
	done := make(chan struct{})
	c.files.start(k, jobUploading, bi.Generation, func(ctx context.Context, report jobReport) (imagefile.Result, error) {
		defer close(done)
		res, err = c.receive(ctx, report, body, size, dir, bi.Spec.Checksum)
		return res, err
	})
	c.queue.Add(bi.Namespace + "/" + bi.Name)
	select {
	case <-done:
	case <-ctx.Done():
		return res, ctx.Err()
	}
	return res, err
}

// receive writes the upload into dir's source.part and prepares it.
func (c *BackingImageController) receive(ctx context.Context, report jobReport, body io.Reader, size int64, dir, checksum string) (imagefile.Result, error) {
	f, part, err := createSourcePart(dir)
	defer os.Remove(part)
	if err != nil {
		return imagefile.Result{}, err
	}
	var got int64
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			f.Close()
			return imagefile.Result{}, err
		}
		n, rerr := body.Read(buf)
		if n > 0 {
			got += int64(n)
			if got > c.uploadLimit {
				f.Close()
				return imagefile.Result{}, fmt.Errorf("the upload passed %d bytes, the limit: %w", c.uploadLimit, ErrImageTooLarge)
			}
			if _, err := f.Write(buf[:n]); err != nil {
				f.Close()
				return imagefile.Result{}, err
			}
			report(percent(got, size) * 9 / 10)
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			f.Close()
			return imagefile.Result{}, fmt.Errorf("reading the upload after %d bytes: %w", got, rerr)
		}
	}
	if size >= 0 && got != size {
		f.Close()
		return imagefile.Result{}, fmt.Errorf("the upload ended after %d of %d bytes", got, size)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return imagefile.Result{}, err
	}
	limits, err := imageLimits(c.ds)
	if err != nil {
		return imagefile.Result{}, err
	}
	return imagefile.Prepare(ctx, part, filepath.Join(dir, backingFileName), checksum, limits)
}

// uploadDisk picks this node's schedulable disk with the most room.
func (c *BackingImageController) uploadDisk() (uuid, path string, err error) {
	node, err := c.ds.Nodes.GetRO(c.controllerID)
	if err != nil {
		return "", "", fmt.Errorf("node %s is not registered yet: %w", c.controllerID, ErrImageNotReady)
	}
	best := int64(-1)
	for name, st := range node.Status.DiskStatus {
		spec, ok := node.Spec.Disks[name]
		if st != nil && st.DiskUUID != "" && ok && spec.AllowScheduling && st.StorageAvailable > best &&
			meta.IsStatusConditionTrue(st.Conditions, v1beta1.ConditionTypeReady) {
			uuid, path, best = st.DiskUUID, spec.Path, st.StorageAvailable
		}
	}
	if uuid == "" {
		return "", "", fmt.Errorf("node %s has no schedulable disk to receive the upload: %w", c.controllerID, ErrImageNotReady)
	}
	return uuid, path, nil
}

// claimUploadDisk puts the disk in the image's spec and makes it the first
// copy, so the copy is reported and the other disks copy from it.
func (c *BackingImageController) claimUploadDisk(ctx context.Context, image, disk string) error {
	// The managers write this image's status too (each its own disks):
	// a conflict is theirs, read again and retry.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return c.claimUploadDiskOnce(ctx, image, disk) })
}

func (c *BackingImageController) claimUploadDiskOnce(ctx context.Context, image, disk string) error {
	bi, err := c.ds.BackingImages.GetLive(ctx, image)
	if err != nil {
		return err
	}
	if _, ok := bi.Spec.DiskFileSpecMap[disk]; !ok {
		if bi.Spec.DiskFileSpecMap == nil {
			bi.Spec.DiskFileSpecMap = map[string]*v1beta1.BackingImageDiskFileSpec{}
		}
		bi.Spec.DiskFileSpecMap[disk] = &v1beta1.BackingImageDiskFileSpec{}
		if bi, err = c.ds.BackingImages.Update(ctx, bi); err != nil {
			return err
		}
	}
	if bi.Status.FirstCopyDisk != disk {
		bi.Status.FirstCopyDisk = disk
		if _, err := c.ds.BackingImages.UpdateStatus(ctx, bi); err != nil {
			return err
		}
	}
	return nil
}
