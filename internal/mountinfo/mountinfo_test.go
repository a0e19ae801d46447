package mountinfo

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseMountInfo(t *testing.T) {
	table := strings.Join([]string{
		`22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda rw`,
		`45 22 0:39 / /tmp/state/vol1 rw,nosuid,nodev,relatime shared:5 master:2 - fuse /dev/fuse rw,user_id=0,group_id=0`,
		`56 22 7:0 / /var/lib/kubelet/a\040b rw,relatime - ext4 /dev/loop0 rw`,
		`57 22 0:5 /loop0 /var/lib/kubelet/block/pvc rw - devtmpfs udev rw,size=1k`,
		`58 22 0:40 / /mnt/sshfs rw - fuse.sshfs host:/x rw`,
		``,
	}, "\n")
	entries, err := Parse(strings.NewReader(table))
	require.NoError(t, err)
	require.Len(t, entries, 5)
	require.Equal(t, Entry{MajorMinor: "0:39", Root: "/", MountPoint: "/tmp/state/vol1", FSType: "fuse", Source: "/dev/fuse"}, entries[1])
	require.Equal(t, "/var/lib/kubelet/a b", entries[2].MountPoint, "octal escapes decoded")
	require.Equal(t, "/loop0", entries[3].Root)

	_, err = Parse(strings.NewReader("1 2 3\n"))
	require.ErrorContains(t, err, "malformed")
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:         `/plain`,
		`/a\040b`:        `/a b`,
		`/tab\011x\012y`: "/tab\tx\ny",
		`/back\134slash`: `/back\slash`,
		`/short\04`:      `/short\04`,
		`/not\999octal`:  `/not\999octal`,
	} {
		require.Equal(t, want, Unescape(in), in)
	}
}
