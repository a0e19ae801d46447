package nbddev

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/nbd"
	"github.com/strata-storage/strata/engineapi"
)

// growingDevice is an engine's volume during an online expansion: its size
// moves up while it is served.
type growingDevice struct {
	blockdev.Device
	size atomic.Int64
}

func (d *growingDevice) Size() int64 { return d.size.Load() }

// serveGrowable serves dev the way an instance manager serves an engine:
// the plain export and the growable one (the engine's own NBD server code),
// on a unix socket only this user and root may use, and returns the
// endpoint the instance manager would publish.
func serveGrowable(t *testing.T, name string, dev blockdev.Device) string {
	t.Helper()
	log := logrus.New()
	srv := nbd.NewServer(nbd.Options{Logger: log})
	require.NoError(t, srv.AddExport(name, dev))
	require.NoError(t, srv.AddExport(name+engineapi.GrowableExportSuffix, dev, nbd.Growable(engineapi.MaxVolumeSize)))
	socket := filepath.Join(shortDir(t), "nbd.sock")
	l, err := net.Listen("unix", socket)
	require.NoError(t, err)
	go func() { _ = srv.Serve(nbd.PeerUIDListener(l, log, nbd.OwnUIDs()...)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return engineapi.UnixNBDEndpoint(socket, name).String()
}

// A mounted filesystem grows with its volume: the device follows Resize,
// xfs_growfs grows the filesystem online, and the data stays. (XFS: online
// ext4 growth needs CAP_SYS_RESOURCE, which these machines' root lacks.)
func TestResizeGrowsTheMountedDevice(t *testing.T) {
	requireSystem(t)
	const before, after = 320 << 20, 448 << 20 // XFS wants 300 MB at least
	dev := &growingDevice{Device: blockdev.NewMem(after)}
	dev.size.Store(before)
	endpoint := serveGrowable(t, "grow1", dev)
	c := newTestFUSELoop(t)
	c.exportSuffix = engineapi.GrowableExportSuffix
	ctx := t.Context()

	loop, err := c.Connect(ctx, "grow1", endpoint)
	require.NoError(t, err)
	size, err := deviceSize(loop)
	require.NoError(t, err)
	assert.Equal(t, int64(before), size, "the device ends at the volume, not at the growable export's ceiling")
	got, err := c.Resize(ctx, "grow1")
	require.NoError(t, err)
	assert.Equal(t, int64(before), got, "nothing to grow yet")

	out, err := exec.Command("mkfs.xfs", "-q", "-f", loop).CombinedOutput()
	require.NoError(t, err, "mkfs.xfs %s: %s", loop, out)
	mnt := t.TempDir()
	out, err = exec.Command("mount", "-t", "xfs", loop, mnt).CombinedOutput()
	require.NoError(t, err, "mount %s: %s", loop, out)
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	sum := writeRandomFile(t, filepath.Join(mnt, "data"), 8<<20)
	dfBefore := dfSize(t, mnt)

	dev.size.Store(after) // the engine expanded online
	got, err = c.Resize(ctx, "grow1")
	require.NoError(t, err)
	assert.Equal(t, int64(after), got)
	size, err = deviceSize(loop)
	require.NoError(t, err)
	assert.Equal(t, int64(after), size)
	out, err = exec.Command("xfs_growfs", mnt).CombinedOutput()
	require.NoError(t, err, "xfs_growfs %s (mounted): %s", mnt, out)
	assert.Greater(t, dfSize(t, mnt), dfBefore+(100<<20), "the mounted filesystem grew")
	assert.Equal(t, sum, hashFile(t, filepath.Join(mnt, "data")))
	sum2 := writeRandomFile(t, filepath.Join(mnt, "more"), 330<<20) // more than there was room for before
	assert.Equal(t, sum2, hashFile(t, filepath.Join(mnt, "more")), "the grown space takes data")

	umount(t, mnt)
	require.NoError(t, c.Disconnect(ctx, "grow1"))
	requireGone(t, c, "grow1")
}

// dfSize is a mounted filesystem's size in bytes as df tells it.
func dfSize(t *testing.T, mnt string) int64 {
	t.Helper()
	out, err := exec.Command("df", "-B1", "--output=size", mnt).CombinedOutput()
	require.NoError(t, err, "df %s: %s", mnt, out)
	lines := strings.Fields(string(out))
	var n int64
	_, err = fmt.Sscan(lines[len(lines)-1], &n)
	require.NoError(t, err, "df said %q", out)
	return n
}
