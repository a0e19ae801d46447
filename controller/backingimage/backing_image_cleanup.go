package backingimage

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// cleanupUnusedCopies keeps status.diskLastRefAtMap (when each wanted copy
// stopped being used by any replica on its disk) and takes out of the spec
// the copies evicted by hand and those unused for longer than the setting
// backing-image-cleanup-wait-interval, never going below
// spec.minNumberOfCopies and never removing the last ready copy while
// another disk still copies from it. wrote is true when the spec was written.
func (s *imageSync) cleanupUnusedCopies() (wrote bool, err error) {
	bi := s.bi
	waitMinutes, err := s.DS.GetSettingInt(types.SettingBackingImageCleanupWaitInterval)
	if err != nil {
		return false, err
	}
	wait := time.Duration(waitMinutes) * time.Minute
	if bi.Status.DiskLastRefAtMap == nil {
		bi.Status.DiskLastRefAtMap = map[string]string{}
	}
	for disk := range bi.Status.DiskLastRefAtMap {
		if _, ok := bi.Spec.DiskFileSpecMap[disk]; !ok {
			delete(bi.Status.DiskLastRefAtMap, disk)
		}
	}
	type candidate struct {
		disk   string
		unused time.Time
	}
	var evicted []string
	var expired []candidate
	next := time.Duration(0)
	for _, disk := range slices.Sorted(maps.Keys(bi.Spec.DiskFileSpecMap)) {
		users, err := s.DS.ImageUsersOnDisk(bi.Name, disk)
		if err != nil {
			return false, err
		}
		if len(users) > 0 {
			delete(bi.Status.DiskLastRefAtMap, disk)
			continue
		}
		if spec := bi.Spec.DiskFileSpecMap[disk]; spec != nil && spec.EvictionRequested {
			evicted = append(evicted, disk)
			continue
		}
		at, err := time.Parse(time.RFC3339, bi.Status.DiskLastRefAtMap[disk])
		if err != nil {
			at = s.now
			bi.Status.DiskLastRefAtMap[disk] = s.now.UTC().Format(time.RFC3339)
		}
		if due := at.Add(wait); s.now.Before(due) {
			if left := due.Sub(s.now); next == 0 || left < next {
				next = left
			}
			continue
		}
		expired = append(expired, candidate{disk, at})
	}
	slices.SortStableFunc(expired, func(a, b candidate) int { return a.unused.Compare(b.unused) })
	remove := slices.Clone(evicted)
	left := len(bi.Spec.DiskFileSpecMap) - len(evicted)
	for _, c := range expired {
		if left <= int(bi.Spec.MinNumberOfCopies) || s.lastSourceCopy(c.disk, remove) {
			continue
		}
		remove = append(remove, c.disk)
		left--
	}
	if next > 0 {
		s.Queue.AddAfter(s.key, next+time.Second)
	}
	if len(remove) == 0 {
		return false, nil
	}
	return true, s.dropFromSpec(remove, fmt.Sprintf("unused for %d minute(s) or evicted", waitMinutes))
}

// lastSourceCopy: disk holds the only ready copy left (once removing goes)
// while another wanted disk still waits for its copy.
func (s *imageSync) lastSourceCopy(disk string, removing []string) bool {
	ready := 0
	for _, r := range kit.ReadyCopies(s.bi) {
		if r != disk && !slices.Contains(removing, r) {
			ready++
		}
	}
	if ready > 0 {
		return false
	}
	for d := range s.bi.Spec.DiskFileSpecMap {
		if d == disk || slices.Contains(removing, d) {
			continue
		}
		if st := s.bi.Status.DiskFileStatusMap[d]; st == nil || st.State != v1beta1.BackingImageStateReady {
			return true
		}
	}
	return false
}

// dropFromSpec removes disks from spec.diskFileSpecMap; each disk's manager
// then removes its copy (removeCopy).
func (s *imageSync) dropFromSpec(disks []string, why string) error {
	bi := s.biRO.DeepCopy()
	for _, d := range disks {
		delete(bi.Spec.DiskFileSpecMap, d)
	}
	if _, err := s.DS.BackingImages.Update(s.ctx, bi); err != nil {
		return err
	}
	for _, d := range disks {
		s.Recorder.Eventf(bi, corev1.EventTypeNormal, EventReasonBackingImageCleanedUp, "cleaning up the copy on disk %s: %s", d, why)
	}
	return nil
}

// removeStrayCopies deletes the image directories on this node's disks that
// no existing image accounts for (see strayImageDirs).
func (c *BackingImageController) removeStrayCopies() {
	images, err := c.DS.BackingImages.ListRO(nil)
	if err != nil {
		return
	}
	keep := map[string]bool{}
	for _, bi := range images {
		if bi.Status.UUID == "" {
			// Its directory name is not known yet: keep everything of that name
			// until it is (a UUID is written before any file).
			return
		}
		keep[bi.Name+"-"+bi.Status.UUID] = true
	}
	node, err := c.DS.Nodes.GetRO(c.ControllerID)
	if err != nil {
		return
	}
	for name, spec := range node.Spec.Disks {
		if st := node.Status.DiskStatus[name]; st == nil || st.DiskUUID == "" {
			continue // a disk not inspected (or missing) is left alone
		}
		for _, dir := range strayImageDirs(spec.Path, keep) {
			if err := os.RemoveAll(dir); err != nil {
				c.Logger.WithError(err).WithField("dir", dir).Warn("Cannot remove a stray backing image copy")
				continue
			}
			c.Logger.WithField("dir", dir).Info("Removed a stray backing image copy")
		}
	}
}
