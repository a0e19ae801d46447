package backingimage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Event reasons of the backing image controller.
const (
	EventReasonBackingImageReady      = "CopyReady"
	EventReasonBackingImageFailed     = "CopyFailed"
	EventReasonBackingImageCleanedUp  = "CopyCleanedUp"
	EventReasonBackingImageFirstCopy  = "FirstCopyDisk"
	EventReasonBackingImageDiskChosen = "DiskRequested"
)

// imageSync is one sync of one backing image on this manager.
type imageSync struct {
	*BackingImageController
	ctx   context.Context
	key   string
	biRO  *v1beta1.BackingImage
	bi    *v1beta1.BackingImage
	owner bool
	now   time.Time
	// finished are the ended jobs whose outcome this sync records in
	// status; they leave the job table when that status is written.
	finished []fileJobKey
	// said are the events and log lines about those outcomes: said once
	// the status is written, so a write that conflicts and is retried
	// does not say them twice.
	said []func()
}

// sayOnceWritten defers an event or log line about a recorded outcome
// until the status that records it is written.
func (s *imageSync) sayOnceWritten(say func()) { s.said = append(s.said, say) }

// syncBackingImage: the owner (status.ownerID) keeps the image-level state —
// finalizer, UUID, which disk fetches the first copy, cleanup of unused
// copies, the summary — and every manager keeps the copies on its own
// disks: fetching, copying, verifying, removing, each reported under its
// disk in status.diskFileStatusMap.
func (c *BackingImageController) syncBackingImage(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return err
	}
	biRO, err := c.DS.BackingImages.GetRO(name)
	if apierrors.IsNotFound(err) {
		c.removeStrayCopies()
		return nil
	}
	if err != nil {
		return err
	}
	owner, err := c.IsResponsibleFor(key, biRO.Status.OwnerID, "")
	if err != nil {
		return err
	}
	s := &imageSync{BackingImageController: c, ctx: ctx, key: key, biRO: biRO, bi: biRO.DeepCopy(), owner: owner,
		now: c.DS.Clock.Now()}
	if owner {
		s.bi.Status.OwnerID = c.ControllerID
		if wrote, err := s.reconcileImage(); wrote || err != nil {
			return err // the spec write brings the image back
		}
	}
	localErr := s.reconcileLocalCopies()
	if owner {
		s.summarize()
	}
	if !equality.Semantic.DeepEqual(s.biRO.Status, s.bi.Status) {
		if _, err := c.DS.BackingImages.UpdateStatus(ctx, s.bi); err != nil {
			return errors.Join(localErr, err)
		}
	}
	for _, k := range s.finished {
		c.files.take(k)
	}
	for _, say := range s.said {
		say()
	}
	if owner && s.bi.DeletionTimestamp != nil && len(s.bi.Status.DiskFileStatusMap) == 0 {
		if _, err := c.DS.BackingImages.RemoveFinalizer(ctx, s.bi, types.FinalizerName); err != nil {
			return errors.Join(localErr, err)
		}
	}
	return localErr
}

// reconcileImage makes the owner's spec changes (finalizer, a first disk, the
// cleanup of unused copies) and status decisions (UUID, first-copy disk,
// last-use times). wrote is true when the spec was written.
func (s *imageSync) reconcileImage() (wrote bool, err error) {
	bi := s.bi
	if bi.DeletionTimestamp == nil && !slices.Contains(bi.Finalizers, types.FinalizerName) {
		_, err := s.DS.BackingImages.AddFinalizer(s.ctx, bi, types.FinalizerName)
		return true, err
	}
	if bi.Status.UUID == "" {
		bi.Status.UUID = rand.String(8)
	}
	if bi.DeletionTimestamp != nil {
		s.dropCopiesOfDownNodes()
		return false, nil
	}
	if len(bi.Spec.DiskFileSpecMap) == 0 && bi.Spec.SourceType != v1beta1.BackingImageSourceTypeUpload {
		return s.requestFirstDisk()
	}
	s.markCopiesOfDownNodes()
	s.chooseFirstCopyDisk()
	if err := s.releaseExport(); err != nil {
		return false, err
	}
	return s.cleanupUnusedCopies()
}

// requestFirstDisk asks for a copy on one of this node's disks when nobody
// asked for any yet: a new image is fetched at once, so its size and checksum
// are known (and checked) before a volume needs it.
func (s *imageSync) requestFirstDisk() (bool, error) {
	node, err := s.DS.Nodes.GetRO(s.ControllerID)
	if err != nil {
		return false, err
	}
	best, bestFree := "", int64(-1)
	for name, st := range node.Status.DiskStatus {
		spec, ok := node.Spec.Disks[name]
		if st == nil || st.DiskUUID == "" || !ok || !spec.AllowScheduling || !meta.IsStatusConditionTrue(st.Conditions, v1beta1.ConditionTypeReady) {
			continue
		}
		if st.StorageAvailable > bestFree {
			best, bestFree = st.DiskUUID, st.StorageAvailable
		}
	}
	if best == "" {
		return false, fmt.Errorf("backing image %s: node %s has no schedulable disk for the first copy", s.bi.Name, s.ControllerID)
	}
	bi := s.biRO.DeepCopy()
	bi.Spec.DiskFileSpecMap = map[string]*v1beta1.BackingImageDiskFileSpec{best: {}}
	if _, err := s.DS.BackingImages.Update(s.ctx, bi); err != nil {
		return false, err
	}
	s.Recorder.Eventf(bi, corev1.EventTypeNormal, EventReasonBackingImageDiskChosen, "fetching the first copy onto disk %s of node %s",
		best, s.ControllerID)
	return true, nil
}

// chooseFirstCopyDisk names the disk that fetches from the source while no
// disk holds a ready copy: the current choice while it is wanted and its
// node is up, else the first wanted disk on an alive node. An uploaded
// image's first disk is where the upload arrived.
func (s *imageSync) chooseFirstCopyDisk() {
	bi := s.bi
	if bi.Spec.SourceType == v1beta1.BackingImageSourceTypeUpload || len(kit.ReadyCopies(bi)) > 0 {
		return
	}
	if s.diskUsable(bi.Status.FirstCopyDisk) {
		return
	}
	for _, disk := range slices.Sorted(maps.Keys(bi.Spec.DiskFileSpecMap)) {
		if s.diskUsable(disk) {
			bi.Status.FirstCopyDisk = disk
			loc, _ := s.DS.LocateDisk(disk)
			s.Recorder.Eventf(bi, corev1.EventTypeNormal, EventReasonBackingImageFirstCopy,
				"the source is fetched onto disk %s of node %s", disk, loc.Node)
			return
		}
	}
}

// diskUsable: the disk is wanted and its node's manager is alive.
func (s *imageSync) diskUsable(disk string) bool {
	if disk == "" {
		return false
	}
	if _, ok := s.bi.Spec.DiskFileSpecMap[disk]; !ok {
		return false
	}
	loc, ok := s.DS.LocateDisk(disk)
	return ok && s.DS.IsNodeAlive(loc.Node)
}

// markCopiesOfDownNodes: a copy on a node whose manager is down cannot be
// vouched for; it is unknown until that manager reports it again.
func (s *imageSync) markCopiesOfDownNodes() {
	for disk, st := range s.bi.Status.DiskFileStatusMap {
		if st == nil || st.State == v1beta1.BackingImageStateUnknown {
			continue
		}
		loc, ok := s.DS.LocateDisk(disk)
		switch {
		case !ok:
			setFileState(st, v1beta1.BackingImageStateUnknown, 0, "no node reports this disk", s.now)
		case !s.DS.IsNodeAlive(loc.Node):
			setFileState(st, v1beta1.BackingImageStateUnknown, 0, fmt.Sprintf("node %s is down", loc.Node), s.now)
		}
	}
}

// dropCopiesOfDownNodes lets a deleted image go although some node is down:
// its copies are removed as stray directories when that node comes back.
func (s *imageSync) dropCopiesOfDownNodes() {
	for disk := range s.bi.Status.DiskFileStatusMap {
		if loc, ok := s.DS.LocateDisk(disk); !ok || !s.DS.IsNodeAlive(loc.Node) {
			delete(s.bi.Status.DiskFileStatusMap, disk)
		}
	}
}

// summarize fills the printer columns: ready/wanted copies and the first
// failure.
func (s *imageSync) summarize() {
	bi := s.bi
	bi.Status.Copies = fmt.Sprintf("%d/%d", len(kit.ReadyCopies(bi)), len(bi.Spec.DiskFileSpecMap))
	bi.Status.Message = ""
	for _, disk := range slices.Sorted(maps.Keys(bi.Status.DiskFileStatusMap)) {
		if st := bi.Status.DiskFileStatusMap[disk]; st != nil && st.State == v1beta1.BackingImageStateFailed {
			bi.Status.Message = disk + ": " + st.Message
			return
		}
	}
}

// setFileState records a copy's state, stamping the transition time only when
// the state changes.
func setFileState(st *v1beta1.BackingImageDiskFileStatus, state v1beta1.BackingImageState, progress int32, msg string, now time.Time) {
	if st.State != state {
		st.LastStateTransitionTime = now.UTC().Format(time.RFC3339)
	}
	st.State, st.Progress, st.Message = state, progress, msg
}
