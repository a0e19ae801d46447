package nbddev

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/internal/mountinfo"
	"github.com/strata-storage/strata/test/need"
)

func TestFuseMountAt(t *testing.T) {
	entries, err := mountinfo.Parse(strings.NewReader(strings.Join([]string{
		`22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw`,
		`45 22 0:39 / /tmp/state/vol1 rw,nosuid,nodev,relatime shared:5 master:2 - fuse /dev/fuse rw,user_id=0,group_id=0`,
		`56 22 7:0 / /var/lib/kubelet/a\040b rw,relatime - ext4 /dev/loop0 rw`,
		`58 22 0:40 / /mnt/sshfs rw - fuse.sshfs host:/x rw`,
	}, "\n")))
	require.NoError(t, err)
	fuse, ok := fuseMountAt(entries, "/tmp/state/vol1")
	require.True(t, ok)
	require.Equal(t, "0:39", fuse.MajorMinor)
	_, ok = fuseMountAt(entries, "/var/lib/kubelet/a b")
	require.False(t, ok, "an ext4 mount is not a FUSE mount")
	_, ok = fuseMountAt(entries, "/mnt/sshfs")
	require.True(t, ok, "fuse.<subtype> counts too")
}

// TestMountPointsUsing runs against the real /dev/null node: a filesystem
// "on" its device number, a mount naming it as source, and a bind mount of
// the node itself all count; an unrelated mount does not.
func TestMountPointsUsing(t *testing.T) {
	need.File(t, "/dev/null")
	var nullFS string
	entries, err := readMountInfo()
	require.NoError(t, err)
	for _, e := range entries {
		if e.MountPoint == "/dev" {
			nullFS = e.MajorMinor
		}
	}
	need.That(t, nullFS != "", "needs /dev to be a mount point (a devtmpfs)")
	table := []mountEntry{
		{MajorMinor: "1:3", Root: "/", MountPoint: "/m/fs"}, // 1:3 is /dev/null's number
		{MajorMinor: "9:9", Root: "/", MountPoint: "/m/source", Source: "/dev/null"},
		{MajorMinor: nullFS, Root: "/null", MountPoint: "/m/bind"},
		{MajorMinor: nullFS, Root: "/zero", MountPoint: "/m/other-node"},
		{MajorMinor: "254:1", Root: "/", MountPoint: "/"},
	}
	got, err := mountPointsUsing(table, "/dev/null")
	require.NoError(t, err)
	require.Equal(t, []string{"/m/bind", "/m/fs", "/m/source"}, got)
}
