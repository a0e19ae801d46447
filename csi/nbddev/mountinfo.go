package nbddev

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountInfoPath is this process's mount table. The CSI plugin runs with the
// host's mount namespace propagated (Bidirectional), so it sees the kubelet's
// staging and publish mounts here.
const mountInfoPath = "/proc/self/mountinfo"

// mountEntry is one line of /proc/self/mountinfo (proc(5)); only the fields
// this package reads. k8s.io/mount-utils is not a dependency of the module,
// and parsing these few fields is simpler than adding it.
type mountEntry struct {
	MajorMinor string // "7:0": the device of the mounted filesystem
	Root       string // path within that filesystem that is mounted (bind mounts)
	MountPoint string
	FSType     string
	Source     string
}

func readMountInfo() ([]mountEntry, error) {
	f, err := os.Open(mountInfoPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := parseMountInfo(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", mountInfoPath, err)
	}
	return entries, nil
}

func parseMountInfo(r io.Reader) ([]mountEntry, error) {
	var entries []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		e, err := parseMountInfoLine(sc.Text())
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
	return entries, sc.Err()
}

// parseMountInfoLine reads "id parent maj:min root mountpoint opts [optional...] - fstype source superopts".
// The optional fields vary in number, hence the search for the "-" separator.
func parseMountInfoLine(line string) (mountEntry, error) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+2 >= len(fields) {
		return mountEntry{}, fmt.Errorf("malformed mountinfo line %q", line)
	}
	return mountEntry{
		MajorMinor: fields[2],
		Root:       unescapeMountPath(fields[3]),
		MountPoint: unescapeMountPath(fields[4]),
		FSType:     fields[sep+1],
		Source:     unescapeMountPath(fields[sep+2]),
	}, nil
}

// unescapeMountPath undoes the kernel's octal escapes (\040 for a space,
// \011, \012, \134) in mountinfo paths.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

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
