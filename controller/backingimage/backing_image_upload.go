package backingimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// CopyFile returns the path of the image's ready copy on disk, a disk of
// this node, for a peer to fetch. uuid must be the image's: a peer with a
// stale view never gets the file of an earlier image of the same name.
func (c *BackingImageController) CopyFile(image, disk, uuid string) (string, error) {
	bi, err := c.DS.BackingImages.GetRO(image)
	if err != nil {
		return "", fmt.Errorf("backing image %s: %w", image, types.ErrImageNotFound)
	}
	if bi.Status.UUID == "" || bi.Status.UUID != uuid {
		return "", fmt.Errorf("backing image %s has UUID %q, not %q: %w", image, bi.Status.UUID, uuid, types.ErrImageNotFound)
	}
	path, ok := c.localDiskPath(disk)
	if !ok {
		return "", fmt.Errorf("disk %s is not on node %s: %w", disk, c.ControllerID, types.ErrImageNotFound)
	}
	if !c.files.isVerified(fileJobKey{bi.UID, disk}) {
		return "", fmt.Errorf("the copy of %s on disk %s is not ready: %w", image, disk, types.ErrImageNotReady)
	}
	return kit.BackingImageFile(path, bi), nil
}

// localDiskPath is the path of this node's disk with the given UUID.
func (c *BackingImageController) localDiskPath(disk string) (string, bool) {
	loc, ok := c.DS.LocateDisk(disk)
	if !ok || loc.Node != c.ControllerID {
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
//
// One upload per image at a time, cluster-wide: a second one, to this
// manager or another, is refused with types.ErrImageConflict before any byte of
// it is read. Here an in-memory mark says so at once; across managers the
// first-copy disk's status does (receiving the upload, claimed with the
// image's resourceVersion, so of two racing claims one fails and looks
// again). Upload returns once the transfer is over, never leaving the body
// to a job still reading it; a client that goes away ends the transfer.
func (c *BackingImageController) Upload(ctx context.Context, image string, body io.Reader, size int64) (imagefile.Result, error) {
	var res imagefile.Result
	bi, err := c.DS.BackingImages.GetROOrLive(ctx, image)
	if apierrors.IsNotFound(err) {
		return res, fmt.Errorf("backing image %s does not exist: %w", image, types.ErrImageNotFound)
	}
	if err != nil {
		return res, err
	}
	if !c.files.beginUpload(bi.UID) {
		return res, fmt.Errorf("an upload of backing image %s is already in progress on node %s; wait for it to end: %w",
			image, c.ControllerID, types.ErrImageConflict)
	}
	claimed := false
	defer func() {
		c.files.endUpload(bi.UID)
		if claimed { // the sync sees the mark gone: a claim with no upload behind it is withdrawn
			c.Queue.Add(bi.Namespace + "/" + bi.Name)
		}
	}()
	switch {
	case bi.Spec.SourceType != v1beta1.BackingImageSourceTypeUpload:
		return res, fmt.Errorf("backing image %s has sourceType %s, not upload: %w", image, bi.Spec.SourceType, types.ErrImageConflict)
	case bi.DeletionTimestamp != nil:
		return res, fmt.Errorf("backing image %s is being deleted: %w", image, types.ErrImageConflict)
	case len(kit.ReadyCopies(bi)) > 0:
		return res, fmt.Errorf("backing image %s already holds its data; create another image for other data: %w", image, types.ErrImageConflict)
	case bi.Status.UUID == "":
		return res, fmt.Errorf("backing image %s is not initialised yet; try again in a moment: %w", image, types.ErrImageNotReady)
	case size > c.uploadLimit:
		return res, fmt.Errorf("the upload is %d bytes, more than this manager accepts (%d, --upload-size-limit): %w", size, c.uploadLimit, types.ErrImageTooLarge)
	}
	if err := c.uploadElsewhere(bi); err != nil {
		return res, err
	}
	disk, diskPath, err := c.uploadDisk()
	if err != nil {
		return res, err
	}
	k := fileJobKey{bi.UID, disk}
	if job, ok := c.files.get(k); ok {
		if job.done { // the last upload's end, not recorded yet
			return res, fmt.Errorf("the previous transfer of %s onto disk %s is being recorded; try again in a moment: %w", image, disk, types.ErrImageNotReady)
		}
		return res, fmt.Errorf("%s of %s onto disk %s is running: %w", job.kind, image, disk, types.ErrImageConflict)
	}
	claimed = true // from here status may hold a claim, even if the call below fails after writing it
	if err := c.claimUploadDisk(ctx, image, disk); err != nil {
		return res, err
	}
	dir := kit.BackingImageDir(diskPath, bi.Name, bi.Status.UUID)
	ran := false
	ended := c.files.startFrom(ctx, k, jobUploading, bi.Generation, func(ctx context.Context, report jobReport) (imagefile.Result, error) {
		ran = true
		res, err = c.receive(ctx, report, body, size, dir, bi.Spec.Checksum)
		return res, err
	})
	if ended == nil { // a job for the disk appeared since the check above
		return res, fmt.Errorf("another transfer of %s onto disk %s started: %w", image, disk, types.ErrImageConflict)
	}
	c.Queue.Add(bi.Namespace + "/" + bi.Name)
	<-ended
	if !ran { // stopped while waiting for a transfer slot
		if err = ctx.Err(); err == nil {
			err = fmt.Errorf("the upload of %s was stopped before it began (the image changed): %w", image, context.Canceled)
		}
	}
	return res, err
}

// uploadElsewhere refuses an upload while another manager receives one for
// the image: its first-copy disk is receiving the upload and that disk's
// node is alive. A manager that died mid-upload holds nothing: its copy
// turns unknown, and when it is back it finds no upload and says so.
func (c *BackingImageController) uploadElsewhere(bi *v1beta1.BackingImage) error {
	first := bi.Status.FirstCopyDisk
	st := bi.Status.DiskFileStatusMap[first]
	if first == "" || st == nil || st.State != v1beta1.BackingImageStateInProgress || st.Message != jobUploading {
		return nil
	}
	loc, ok := c.DS.LocateDisk(first)
	if !ok || loc.Node == c.ControllerID || !c.DS.IsNodeAlive(loc.Node) {
		return nil // this node's own mark is in memory (beginUpload), not in status
	}
	return fmt.Errorf("an upload of backing image %s is already in progress on node %s; wait for it to end: %w",
		bi.Name, loc.Node, types.ErrImageConflict)
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
				return imagefile.Result{}, fmt.Errorf("the upload passed %d bytes, the limit: %w", c.uploadLimit, types.ErrImageTooLarge)
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
	limits, err := imageLimits(c.DS)
	if err != nil {
		return imagefile.Result{}, err
	}
	return imagefile.Prepare(ctx, part, filepath.Join(dir, kit.BackingFileName), checksum, limits)
}

// uploadDisk picks this node's schedulable disk with the most room.
func (c *BackingImageController) uploadDisk() (uuid, path string, err error) {
	node, err := c.DS.Nodes.GetRO(c.ControllerID)
	if err != nil {
		return "", "", fmt.Errorf("node %s is not registered yet: %w", c.ControllerID, types.ErrImageNotReady)
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
		return "", "", fmt.Errorf("node %s has no schedulable disk to receive the upload: %w", c.ControllerID, types.ErrImageNotReady)
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
	bi, err := c.DS.BackingImages.GetLive(ctx, image)
	if err != nil {
		return err
	}
	// Checked again on each read: another manager's claim may have landed
	// since the cached read, and then this claim's write conflicts.
	if len(kit.ReadyCopies(bi)) > 0 {
		return fmt.Errorf("backing image %s already holds its data; create another image for other data: %w", image, types.ErrImageConflict)
	}
	if err := c.uploadElsewhere(bi); err != nil {
		return err
	}
	if _, ok := bi.Spec.DiskFileSpecMap[disk]; !ok {
		if bi.Spec.DiskFileSpecMap == nil {
			bi.Spec.DiskFileSpecMap = map[string]*v1beta1.BackingImageDiskFileSpec{}
		}
		bi.Spec.DiskFileSpecMap[disk] = &v1beta1.BackingImageDiskFileSpec{}
		if bi, err = c.DS.BackingImages.Update(ctx, bi); err != nil {
			return err
		}
	}
	// The claim others see: the first copy is here, receiving the upload.
	st := bi.Status.DiskFileStatusMap[disk]
	if bi.Status.FirstCopyDisk != disk || st == nil || st.State != v1beta1.BackingImageStateInProgress || st.Message != jobUploading {
		bi.Status.FirstCopyDisk = disk
		if bi.Status.DiskFileStatusMap == nil {
			bi.Status.DiskFileStatusMap = map[string]*v1beta1.BackingImageDiskFileStatus{}
		}
		if st == nil {
			st = &v1beta1.BackingImageDiskFileStatus{}
			bi.Status.DiskFileStatusMap[disk] = st
		}
		setFileState(st, v1beta1.BackingImageStateInProgress, 0, jobUploading, c.DS.Clock.Now())
		if _, err := c.DS.BackingImages.UpdateStatus(ctx, bi); err != nil {
			return err
		}
	}
	return nil
}

// Download writes a ready copy of the image to w as an extent stream
// (imagefile.WriteExtents: only the data, holes skipped): from this node's
// disks when one holds it, else fetched from the manager of a node that
// does (the peer route, with this manager's certificate) and passed on.
func (c *BackingImageController) Download(ctx context.Context, image string, w io.Writer) error {
	bi, err := c.DS.BackingImages.GetRO(image)
	if err != nil {
		return fmt.Errorf("backing image %s: %w", image, types.ErrImageNotFound)
	}
	s := &imageSync{BackingImageController: c, bi: bi}
	src, waiting := s.copySource("")
	switch {
	case src.localPath != "":
		return imagefile.WriteExtents(ctx, w, src.localPath)
	case src.url != "":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, src.url, nil)
		if err != nil {
			return err
		}
		resp, err := c.httpClient.Do(req)
		if err != nil {
			return fmt.Errorf("fetching the copy on node %s: %w", src.node, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("fetching the copy on node %s: %s: %w", src.node, resp.Status, types.ErrImageNotReady)
		}
		_, err = io.Copy(w, resp.Body)
		return err
	}
	if waiting == "" {
		waiting = "no ready copy"
	}
	return fmt.Errorf("backing image %s has no copy to download yet (%s): %w", image, waiting, types.ErrImageNotReady)
}
