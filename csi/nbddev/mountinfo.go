package nbddev

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/internal/mountinfo"
)

// mountInfoPath is this process's mount table. The CSI plugin runs with the
// host's mount namespace propagated (Bidirectional), so it sees the kubelet's
// staging and publish mounts here.
// mountEntry is one line of the mount table.
type mountEntry = mountinfo.Entry

func readMountInfo() ([]mountEntry, error) { return mountinfo.Read() }

// mountPointsUsing lists where device is in use by the mount table: a
// filesystem on it (by major:minor or source path) or its device node
// bind-mounted elsewhere (how the kubelet publishes a raw block volume).
func mountPointsUsing(entries []mountEntry, device string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(device, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", device, err)
	}
	devNum := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	// The filesystem holding the device node (devtmpfs): a bind mount of
	// the node shows that filesystem's number and the node's name as root.
	nodeFS := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	base := filepath.Base(device)
	seen := map[string]bool{}
	for _, e := range entries {
		bindOfNode := e.MajorMinor == nodeFS && filepath.Base(e.Root) == base
		if e.MajorMinor == devNum || e.Source == device || bindOfNode {
			seen[e.MountPoint] = true
		}
	}
	points := make([]string, 0, len(seen))
	for p := range seen {
		points = append(points, p)
	}
	sort.Strings(points)
	return points, nil
}

// fuseMountAt returns the FUSE mount at dir, if any. nbdfuse 1.14 mounts
// with fstype "fuse" and source "/dev/fuse" (not "fuse.nbdfuse"), so the
// mount point is what identifies it.
func fuseMountAt(entries []mountEntry, dir string) (mountEntry, bool) {
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.MountPoint == dir && (e.FSType == "fuse" || strings.HasPrefix(e.FSType, "fuse.")) {
			return e, true
		}
	}
	return mountEntry{}, false
}
