package backingimage

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/atomicfile"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// reconcileLocalCopies drives the copies on this node's disks: the wanted
// ones toward ready, the unwanted ones (cleaned up, evicted, or the image
// deleted) to terminating and then gone.
func (s *imageSync) reconcileLocalCopies() error {
	bi := s.bi
	if bi.Status.UUID == "" {
		return nil // the owner names the image's files first
	}
	node, err := s.DS.Nodes.GetRO(s.ControllerID)
	if err != nil {
		return nil // not registered yet; its add event brings every image back
	}
	if bi.Status.DiskFileStatusMap == nil {
		bi.Status.DiskFileStatusMap = map[string]*v1beta1.BackingImageDiskFileStatus{}
	}
	var errs []error
	for disk, loc := range datastore.NodeDisks(node) {
		_, wanted := bi.Spec.DiskFileSpecMap[disk]
		wanted = wanted && bi.DeletionTimestamp == nil
		st, has := bi.Status.DiskFileStatusMap[disk]
		switch {
		case !loc.Ready && has && st != nil:
			// No file work on a disk that cannot be read; a copy there is
			// unknown until the disk is back (maybe at another path).
			if wanted {
				setFileState(st, v1beta1.BackingImageStateUnknown, 0, "disk "+loc.Name+" is not ready", s.now)
			} else {
				delete(bi.Status.DiskFileStatusMap, disk)
			}
		case !loc.Ready:
		case wanted:
			if !has || st == nil {
				st = &v1beta1.BackingImageDiskFileStatus{}
				setFileState(st, v1beta1.BackingImageStatePending, 0, "", s.now)
				bi.Status.DiskFileStatusMap[disk] = st
			}
			errs = append(errs, s.driveCopy(disk, loc.Path, st))
		case has:
			errs = append(errs, s.removeCopy(disk, loc.Path, st))
		}
	}
	return errors.Join(errs...)
}

// removeCopy takes a copy away in two steps, each seen in status: the state
// turns terminating (its transfer stopped), then the directory goes and the
// entry with it.
func (s *imageSync) removeCopy(disk, diskPath string, st *v1beta1.BackingImageDiskFileStatus) error {
	k := fileJobKey{s.bi.UID, disk}
	if st == nil || st.State != v1beta1.BackingImageStateTerminating {
		s.files.stop(k)
		if st == nil {
			st = &v1beta1.BackingImageDiskFileStatus{}
			s.bi.Status.DiskFileStatusMap[disk] = st
		}
		setFileState(st, v1beta1.BackingImageStateTerminating, 0, "removing the copy", s.now)
		return nil
	}
	dir := kit.BackingImageDir(diskPath, s.bi.Name, s.bi.Status.UUID)
	if err := os.RemoveAll(dir); err != nil {
		st.Message = fmt.Sprintf("removing %s: %v", dir, err)
		return fmt.Errorf("backing image %s: %s", s.bi.Name, st.Message)
	}
	delete(s.bi.Status.DiskFileStatusMap, disk)
	s.Recorder.Eventf(s.bi, corev1.EventTypeNormal, EventReasonBackingImageCleanedUp, "removed the copy on disk %s (%s)", disk, dir)
	return nil
}

// driveCopy moves one wanted copy along: it reports a running transfer,
// records a finished one, waits out the back-off of a failed one, checks a
// file found on disk, or starts the transfer the copy needs.
func (s *imageSync) driveCopy(disk, diskPath string, st *v1beta1.BackingImageDiskFileStatus) error {
	k := fileJobKey{s.bi.UID, disk}
	if job, ok := s.files.get(k); ok {
		if !job.done {
			if !(job.kind == jobVerifying && st.State == v1beta1.BackingImageStateReady) {
				setFileState(st, v1beta1.BackingImageStateInProgress, job.progress, job.kind, s.now)
			}
			return nil
		}
		// Taken only once the status that records it is written
		// (syncBackingImage): if that write conflicts, the next sync
		// records the job again, so a failure for good is not fetched
		// anew and a download's checksum is not lost.
		s.finished = append(s.finished, k)
		return s.recordJob(disk, st, job)
	}
	if disk == s.bi.Status.FirstCopyDisk && st.State == v1beta1.BackingImageStateInProgress && st.Message == jobUploading &&
		s.files.uploading(s.bi.UID) {
		return nil // an upload claimed this disk and its job is about to start: the claim stays
	}
	if st.State == v1beta1.BackingImageStateFailed && s.holdFailed(k, st) {
		return nil
	}
	file := kit.BackingImageFile(diskPath, s.bi)
	if _, err := os.Stat(file); err == nil {
		if s.files.isVerified(k) {
			setFileState(st, v1beta1.BackingImageStateReady, 100, "", s.now)
			return nil
		}
		// Found, not read by this process: check it once before trusting it.
		s.startJob(k, jobVerifying, func(ctx context.Context, _ jobReport) (imagefile.Result, error) {
			return imagefile.Result{}, verifyCopy(ctx, file, s.bi.Status.Checksum)
		})
		if st.State != v1beta1.BackingImageStateReady {
			setFileState(st, v1beta1.BackingImageStateInProgress, 0, jobVerifying, s.now)
		}
		return nil
	}
	s.files.forgetVerified(k)
	return s.startTransfer(k, diskPath, st)
}

// holdFailed tells whether a failed copy waits: one that failed for good
// until the image's spec or a limit setting changes (then it is tried at
// once), any other until its back-off is over.
func (s *imageSync) holdFailed(k fileJobKey, st *v1beta1.BackingImageDiskFileStatus) bool {
	gen, ok := s.files.failedForGoodAt(k)
	if !ok && st.FailedGeneration > 0 { // failed for good before this process started
		gen, ok = st.FailedGeneration, true
	}
	if ok {
		if gen == s.bi.Generation && !limitSettingMoved(s.DS, st) {
			return true
		}
		s.files.forgetFailure(k)
		st.FailedGeneration, st.FailedSetting, st.FailedSettingValue = 0, "", ""
		return false
	}
	if wait := s.retryWait(st); wait > 0 {
		s.Queue.AddAfter(s.key, wait)
		return true
	}
	return false
}

// retryWait is what is left of a failed copy's back-off.
func (s *imageSync) retryWait(st *v1beta1.BackingImageDiskFileStatus) time.Duration {
	failedAt, err := time.Parse(time.RFC3339, st.LastStateTransitionTime)
	if err != nil {
		return 0
	}
	return failedAt.Add(retryDelay(st.Attempts)).Sub(s.now)
}

// recordJob writes how a finished transfer ended.
func (s *imageSync) recordJob(disk string, st *v1beta1.BackingImageDiskFileStatus, job fileJob) error {
	k := fileJobKey{s.bi.UID, disk}
	s.files.forgetFailure(k)
	if job.err != nil {
		if errors.Is(job.err, context.Canceled) {
			setFileState(st, v1beta1.BackingImageStatePending, 0, "the transfer was stopped; starting again", s.now)
			s.Queue.Add(s.key)
			return nil
		}
		s.recordFailure(k, st, job)
		return nil
	}
	if job.kind != jobVerifying && s.bi.Status.Checksum == "" && job.result.Checksum != "" {
		s.bi.Status.Checksum, s.bi.Status.VirtualSize = job.result.Checksum, job.result.VirtualSize
		s.bi.Status.Size = job.result.SourceSize
	}
	if st.State != v1beta1.BackingImageStateReady {
		bi := s.bi
		s.sayOnceWritten(func() {
			s.Recorder.Eventf(bi, corev1.EventTypeNormal, EventReasonBackingImageReady, "the copy on disk %s is ready (%s)", disk, job.kind)
		})
	}
	st.Attempts, st.FailedGeneration = 0, 0
	setFileState(st, v1beta1.BackingImageStateReady, 100, "", s.now)
	return nil
}

// notRetried ends the message of a copy that failed for good. The source
// and the checksum are immutable, so the fix is usually a new image; an
// upload is fixed by uploading the right bytes (a new upload starts a new
// job whatever the copy's state).
const (
	notRetried       = "not retried until the image's spec changes; re-create the image with the right source or checksum"
	notRetriedUpload = "upload the right image again"
)

// permanentCopyError: the source's bytes themselves are wrong (not the
// checksum asked for, not a disk image Strata takes, larger than a cap) or
// its URL leads where downloads may not go. Fetching it again gives the
// same answer, so such a copy is not retried with back-off (issue 23: a
// checksum mismatch was refetched every few minutes for ever; issue 24: a
// decompression bomb would be unpacked to the cap again each time); a
// network error, a stalled server, a full disk, a stopped peer are retried.
func permanentCopyError(err error) bool {
	return errors.Is(err, imagefile.ErrChecksumMismatch) || errors.Is(err, imagefile.ErrNotAnImage) ||
		errors.Is(err, imagefile.ErrLimitExceeded) || errors.Is(err, imagefile.ErrAddressRefused)
}

// recordFailure marks the copy failed: for good (held until the image's
// spec changes, see holdFailed) or to be retried after a back-off.
func (s *imageSync) recordFailure(k fileJobKey, st *v1beta1.BackingImageDiskFileStatus, job fileJob) {
	st.Attempts++
	msg := fmt.Sprintf("%s: %v", job.kind, job.err)
	log := s.Logger.WithFields(logrus.Fields{"backingImage": s.bi.Name, "disk": k.disk, "attempt": st.Attempts}).WithError(job.err)
	name := limitSetting(job.err)
	if name != "" && s.files.limitChangedSince(name, job.startedAt) {
		// Refused by a cap whose value changed while it ran: it may have
		// run with the old value, so it is retried now, not held.
		setFileState(st, v1beta1.BackingImageStateFailed, 0, msg, s.now)
		log.WithField("setting", name).Info("Backing image copy refused by a setting that changed meanwhile; retrying now")
		s.Queue.Add(s.key)
		return
	}
	if permanentCopyError(job.err) {
		s.files.markFailedForGood(k, job.generation)
		st.FailedGeneration = job.generation // survives a manager restart
		st.FailedSetting, st.FailedSettingValue = "", ""
		if name != "" {
			value, _ := s.DS.GetSettingValue(name) // from the cache; "" if unset, which any value differs from
			st.FailedSetting, st.FailedSettingValue = string(name), value
		}
		msg += "; " + notRetriedHint(job.kind, job.err)
		setFileState(st, v1beta1.BackingImageStateFailed, 0, msg, s.now)
		if name != "" {
			log = log.WithField("setting", name)
		}
		bi := s.bi
		s.sayOnceWritten(func() {
			s.Recorder.Eventf(bi, corev1.EventTypeWarning, EventReasonBackingImageFailed, "disk %s: %s", k.disk, msg)
			log.Warn("Backing image copy failed for good; not retried until the image's spec (or the setting named) changes")
		})
		return
	}
	setFileState(st, v1beta1.BackingImageStateFailed, 0, msg, s.now)
	bi, attempts := s.bi, st.Attempts
	s.sayOnceWritten(func() {
		s.Recorder.Eventf(bi, corev1.EventTypeWarning, EventReasonBackingImageFailed, "disk %s, attempt %d: %s (next try in %s)",
			k.disk, attempts, msg, retryDelay(attempts))
		log.WithField("retryIn", retryDelay(attempts)).Warn("Backing image copy failed, will retry")
	})
	s.Queue.AddAfter(s.key, retryDelay(st.Attempts))
}

// Job kinds, as they appear in a copy's message.
const (
	jobVerifying   = "verifying the checksum"
	jobDownloading = "downloading"
	jobUploading   = "receiving the upload"
)

// startTransfer starts what the copy on disk needs: a copy of a ready copy
// (this node's first, then a peer's), or, on the first-copy disk while no
// copy is ready, a fetch from the source.
func (s *imageSync) startTransfer(k fileJobKey, diskPath string, st *v1beta1.BackingImageDiskFileStatus) error {
	bi := s.bi
	dir := kit.BackingImageDir(diskPath, bi.Name, bi.Status.UUID)
	file := filepath.Join(dir, kit.BackingFileName)
	want := bi.Status.Checksum
	src, waiting := s.copySource(k.disk)
	var kind string
	var work func(ctx context.Context, report jobReport) (imagefile.Result, error)
	switch {
	case waiting != "":
		setFileState(st, v1beta1.BackingImageStatePending, 0, waiting, s.now)
		return nil
	case src.export:
		return s.startExport(k, diskPath, st)
	case src.localPath != "":
		kind = "copying from disk " + src.disk
		work = func(ctx context.Context, report jobReport) (imagefile.Result, error) {
			if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
				return imagefile.Result{}, err
			}
			err := imagefile.CopyFile(ctx, src.localPath, file, func(d, t int64) { report(percent(d, t)) })
			return imagefile.Result{}, errors.Join(err, checkCopy(ctx, err, file, want))
		}
	case src.url != "":
		kind = "copying from disk " + src.disk + " of node " + src.node
		work = func(ctx context.Context, report jobReport) (imagefile.Result, error) {
			if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
				return imagefile.Result{}, err
			}
			err := imagefile.FetchExtents(ctx, s.httpClient, src.url, file, func(d, t int64) { report(percent(d, t)) })
			return imagefile.Result{}, errors.Join(err, checkCopy(ctx, err, file, want))
		}
	default: // the source itself: only a download is fetched; an upload arrives
		kind = jobDownloading
		imageURL := bi.Spec.SourceParameters[v1beta1.BackingImageParameterURL]
		checksum := bi.Spec.Checksum
		work = func(ctx context.Context, report jobReport) (imagefile.Result, error) {
			return s.download(ctx, report, imageURL, dir, checksum)
		}
	}
	s.startJob(k, kind, work)
	setFileState(st, v1beta1.BackingImageStateInProgress, 0, kind, s.now)
	return nil
}

// download fetches url into dir's source.part (resuming what a killed
// manager or a stalled server left), within the download settings, then
// prepares the raw image beside it within the size cap. A part file that
// turned out not to be a usable image goes, so the next try fetches afresh.
func (s *imageSync) download(ctx context.Context, report jobReport, imageURL, dir, checksum string) (imagefile.Result, error) {
	policy, err := downloadPolicy(s.DS)
	if err != nil {
		return imagefile.Result{}, err
	}
	limits, err := imageLimits(s.DS)
	if err != nil {
		return imagefile.Result{}, err
	}
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return imagefile.Result{}, err
	}
	part := filepath.Join(dir, backingSourcePart)
	if _, err := imagefile.Download(ctx, policy, imageURL, part, func(d, t int64) { report(percent(d, t) * 9 / 10) }); err != nil {
		if permanentCopyError(err) {
			os.Remove(part) // refused for good: no prefix worth resuming
		}
		return imagefile.Result{}, err
	}
	res, err := imagefile.Prepare(ctx, part, filepath.Join(dir, kit.BackingFileName), checksum, limits)
	if err != nil && ctx.Err() == nil {
		os.Remove(part)
		return res, err
	}
	if err == nil {
		os.Remove(part)
	}
	return res, err
}

// checkCopy verifies a finished copy (copyErr nil) against the image's checksum.
func checkCopy(ctx context.Context, copyErr error, file, want string) error {
	if copyErr != nil {
		return nil
	}
	return verifyCopy(ctx, file, want)
}

// verifyCopy reads the file and compares its SHA-512 with want; a copy that
// does not match is removed, so it is fetched again rather than used. The
// error is not imagefile.ErrChecksumMismatch on purpose: the source was
// already found good, so a bad copy is damage that a new copy repairs.
func verifyCopy(ctx context.Context, file, want string) error {
	if want == "" {
		return nil
	}
	got, _, err := imagefile.Checksum(ctx, file)
	if err != nil {
		return err
	}
	if got != want {
		os.Remove(file)
		return fmt.Errorf("checksum mismatch: the image's checksum is %s, the copy's SHA-512 is %s; the copy was removed", want, got)
	}
	return nil
}

// copySource says where the copy on disk comes from; waiting says why it
// cannot start yet.
type copySource struct {
	disk, node string
	localPath  string // a ready copy on this node
	url        string // a ready copy on a peer, served by its manager
	export     bool   // the first copy, exported from a volume's snapshot
}

func (s *imageSync) copySource(disk string) (copySource, string) {
	bi := s.bi
	var remote []copySource
	for _, r := range kit.ReadyCopies(bi) {
		if r == disk {
			continue
		}
		loc, ok := s.DS.LocateDisk(r)
		if !ok {
			continue
		}
		if loc.Node == s.ControllerID {
			return copySource{disk: r, node: loc.Node, localPath: kit.BackingImageFile(loc.Path, bi)}, ""
		}
		node, err := s.DS.Nodes.GetRO(loc.Node)
		if err == nil && node.Status.APIAddress != "" && s.DS.IsNodeAlive(loc.Node) {
			remote = append(remote, copySource{disk: r, node: loc.Node, url: fmt.Sprintf("%s://%s/v1/backingimages/%s/disks/%s/file?uuid=%s",
				s.peerScheme, node.Status.APIAddress, url.PathEscape(bi.Name), url.PathEscape(r), url.QueryEscape(bi.Status.UUID))})
		}
	}
	if len(remote) > 0 {
		return remote[0], ""
	}
	if len(kit.ReadyCopies(bi)) > 0 {
		return copySource{}, "waiting for a node holding a ready copy to be reachable"
	}
	switch {
	case bi.Spec.SourceType == v1beta1.BackingImageSourceTypeUpload && bi.Status.FirstCopyDisk == "":
		return copySource{}, "waiting for the image to be uploaded"
	case bi.Status.FirstCopyDisk != disk:
		return copySource{}, fmt.Sprintf("waiting for the first copy, on disk %s", bi.Status.FirstCopyDisk)
	case bi.Spec.SourceType == v1beta1.BackingImageSourceTypeUpload:
		return copySource{}, "waiting for the upload to be sent again"
	case bi.Spec.SourceType == v1beta1.BackingImageSourceTypeExportFromVolume:
		return copySource{export: true}, ""
	}
	return copySource{}, ""
}

// startJob starts a transfer, tying it to this image's key. Each start is
// logged: a copy retried without end shows as a run of these lines.
func (s *imageSync) startJob(k fileJobKey, kind string, work func(ctx context.Context, report jobReport) (imagefile.Result, error)) {
	s.Logger.WithFields(logrus.Fields{"backingImage": s.bi.Name, "disk": k.disk, "kind": kind}).Info("Starting backing image transfer")
	s.files.start(k, kind, s.bi.Generation, work)
}
