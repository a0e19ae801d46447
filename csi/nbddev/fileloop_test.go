package nbddev

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/fusefile"
	"github.com/strata-storage/strata/engineapi"
)

// serveFile mounts dev as volume's file in fileDir, as an instance manager
// with --fuse-dir does (the real FUSE server, engine/fusefile).
func serveFile(t *testing.T, fileDir, volume string, dev blockdev.Device) *fusefile.Server {
	t.Helper()
	dir := filepath.Join(fileDir, volume)
	require.NoError(t, os.MkdirAll(dir, 0o700))
	s, err := fusefile.Mount(dir, dev, fusefile.Options{Log: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newTestFileLoop(t *testing.T) *FileLoop {
	t.Helper()
	c, err := NewFileLoop(shortDir(t), newTestFUSELoop(t), testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() {
		if got, err := c.Connected(); err == nil {
			for id := range got {
				_ = c.Disconnect(context.Background(), id)
			}
		}
	})
	return c
}

// localEndpoint is what this node's instance manager publishes for volume.
func localEndpoint(volume string) string {
	return engineapi.UnixNBDEndpoint("/run/strata/nbd.sock", volume).String()
}

// A volume the instance manager serves as a file gets a loop device on
// that file: its bytes are the engine's, Connect is idempotent, the
// device grows with the engine, and Disconnect leaves nothing bound.
func TestFileLoopConnectsToTheInstanceManagersFile(t *testing.T) {
	requireSystem(t)
	c := newTestFileLoop(t)
	ctx := context.Background()
	dev := blockdev.NewMem(8 << 20)
	serveFile(t, c.fileDir, "vol-a", dev)

	device, err := c.Connect(ctx, "vol-a", localEndpoint("vol-a"))
	require.NoError(t, err)
	f, err := os.OpenFile(device, os.O_RDWR|unix.O_DIRECT, 0)
	require.NoError(t, err)
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	defer unix.Munmap(buf)
	copy(buf, bytes.Repeat([]byte("strata"), 700))
	_, err = f.WriteAt(buf, 1<<20)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	got := make([]byte, 4096)
	_, err = dev.ReadAt(got, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, buf, got, "a write to the device reaches the engine's device")

	again, err := c.Connect(ctx, "vol-a", localEndpoint("vol-a"))
	require.NoError(t, err)
	assert.Equal(t, device, again, "connecting again returns the same device")
	connected, err := c.Connected()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"vol-a": device}, connected)
	d, ok, err := c.Device("vol-a")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, device, d)

	dev.Resize(16 << 20)
	size, err := c.Resize(ctx, "vol-a")
	require.NoError(t, err)
	assert.Equal(t, int64(16<<20), size, "the device grows once the engine has")
	have, err := deviceSize(device)
	require.NoError(t, err)
	assert.Equal(t, int64(16<<20), have)

	require.NoError(t, c.Disconnect(ctx, "vol-a"))
	require.NoError(t, c.Disconnect(ctx, "vol-a"), "disconnecting twice is not an error")
	_, ok, err = c.Device("vol-a")
	require.NoError(t, err)
	assert.False(t, ok, "no loop device is left on the file")
}

// A volume the instance manager does not serve as a file, or an endpoint
// that is not this node's export of the volume, goes through nbdfuse.
func TestFileLoopFallsBackToNBDFUSE(t *testing.T) {
	requireSystem(t)
	c := newTestFileLoop(t)
	ctx := context.Background()
	srv := startNBDServer(t, "vol-b")

	device, err := c.Connect(ctx, "vol-b", srv.endpoint)
	require.NoError(t, err)
	fb, ok, err := c.Fallback.Device("vol-b")
	require.NoError(t, err)
	require.True(t, ok, "nbdfuse holds the connection")
	assert.Equal(t, device, fb)

	// Served as a file now (an instance manager upgraded under it): the
	// connection stays nbdfuse's until it is unstaged.
	serveFile(t, c.fileDir, "vol-b", blockdev.NewMem(testExportSize))
	again, err := c.Connect(ctx, "vol-b", srv.endpoint)
	require.NoError(t, err)
	assert.Equal(t, device, again)
	require.NoError(t, c.Disconnect(ctx, "vol-b"))
	assert.Empty(t, leftovers(t, c.Fallback.stateDir))
	_, ok, err = c.Device("vol-b")
	require.NoError(t, err)
	assert.False(t, ok)
}

// An instance manager killed and restarted leaves the loop device on a
// file that answers no more: Connect replaces it when nothing uses it,
// and refuses, naming the mount, when a filesystem is still on it.
func TestFileLoopReplacesADeadConnection(t *testing.T) {
	requireSystem(t)
	c := newTestFileLoop(t)
	ctx := context.Background()
	dev := blockdev.NewMem(testExportSize)
	first := serveFile(t, c.fileDir, "vol-c", dev)
	device, err := c.Connect(ctx, "vol-c", localEndpoint("vol-c"))
	require.NoError(t, err)
	mkfsExt4(t, device)
	mnt := mountExt4(t, device)

	require.NoError(t, first.Close()) // the server's connection is aborted, as by kill -9
	require.NoError(t, fusefile.CleanStale(filepath.Join(c.fileDir, "vol-c")))
	second := serveFile(t, c.fileDir, "vol-c", dev) // the restarted instance manager
	_, err = c.Connect(ctx, "vol-c", localEndpoint("vol-c"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), mnt, "the error names the mount that holds the dead device")
	connected, err := c.Connected()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"vol-c": device}, connected, "the dead device is still the volume's (its record)")

	umount(t, mnt)
	again, err := c.Connect(ctx, "vol-c", localEndpoint("vol-c"))
	require.NoError(t, err)
	require.NoError(t, probeDevice(again, c.probeTimeout), "the new device answers")
	mnt = mountExt4(t, again)
	umount(t, mnt)

	// Gone again, and nothing on it: Disconnect detaches the dead device.
	require.NoError(t, second.Close())
	require.NoError(t, c.Disconnect(ctx, "vol-c"))
	connected, err = c.Connected()
	require.NoError(t, err)
	assert.Empty(t, connected)
	// Its own devices only: other packages' clusters, tested at the same
	// time, have loop devices on dead files of their own.
	loops, err := loopDevicesOn(c.fileDir, map[string]string{"first": device, "second": again})
	require.NoError(t, err)
	assert.Empty(t, loops, "no loop device is left on a dead file")
}

// An instance manager killed with several volumes on it leaves each loop
// device on a file that reads "/disk" alike: each volume still finds its
// own, so Connect replaces and Disconnect detaches every one of them.
func TestFileLoopTellsApartTheDeadFilesOfSeveralVolumes(t *testing.T) {
	requireSystem(t)
	c := newTestFileLoop(t)
	ctx := context.Background()
	volumes := []string{"vol-d", "vol-e", "vol-f"}
	devs := map[string]blockdev.Device{}
	servers := map[string]*fusefile.Server{}
	first := map[string]string{}
	for _, v := range volumes {
		devs[v] = blockdev.NewMem(testExportSize)
		servers[v] = serveFile(t, c.fileDir, v, devs[v])
		device, err := c.Connect(ctx, v, localEndpoint(v))
		require.NoError(t, err)
		first[v] = device
		detachIfStillOurs(t, device)
	}
	for _, v := range volumes { // the instance manager is killed
		require.NoError(t, servers[v].Close())
		require.NoError(t, fusefile.CleanStale(filepath.Join(c.fileDir, v)))
	}
	// Once the kernel's cached attributes of the dead files expire, their
	// numbers cannot be read (ENOTCONN): what a node sees a second after
	// the kill, and what once left a device bound for good (issue 44).
	for _, v := range volumes {
		require.Eventually(t, func() bool {
			_, err := loopFileID(first[v])
			return errors.Is(err, unix.ENOTCONN)
		}, 10*time.Second, 50*time.Millisecond, "%s's dead file no longer answers a stat", v)
	}
	for _, v := range volumes {
		d, ok, err := c.Device(v)
		require.NoError(t, err)
		require.True(t, ok, "%s still has its dead device", v)
		assert.Equal(t, first[v], d, "%s's device is its own, not another volume's", v)
	}

	for _, v := range volumes[:2] { // restarted: two are staged again
		serveFile(t, c.fileDir, v, devs[v])
		again, err := c.Connect(ctx, v, localEndpoint(v))
		require.NoError(t, err)
		require.NoError(t, probeDevice(again, c.probeTimeout), "%s's new device answers", v)
	}
	loops, err := loopDevicesOn(c.fileDir, first)
	require.NoError(t, err)
	assert.Equal(t, []string{first["vol-f"]}, loops, "only the unstaged volume's dead device is left")

	for _, v := range volumes {
		require.NoError(t, c.Disconnect(ctx, v))
	}
	connected, err := c.Connected()
	require.NoError(t, err)
	assert.Empty(t, connected)
	loops, err = loopDevicesOn(c.fileDir, first)
	require.NoError(t, err)
	assert.Empty(t, loops, "no loop device is left on a dead file")
}

// loopDevicesOn lists which of devices are still bound to a gone file (one
// that is not under fileDir), sorted.
func loopDevicesOn(fileDir string, devices map[string]string) ([]string, error) {
	var out []string
	for _, d := range devices {
		backing, bound, err := loopBacking(d)
		if err != nil {
			return nil, err
		}
		if bound && !strings.HasPrefix(backing, fileDir+"/") {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out, nil
}

// detachIfStillOurs detaches device at the end of the test if it is still
// bound to the file it is bound to now (the same device and inode), so a
// failed test leaves no loop device on a dead file for other packages'
// residue checks; a number given out again to someone else is left alone.
func detachIfStillOurs(t *testing.T, device string) {
	t.Helper()
	id, err := loopFileID(device)
	require.NoError(t, err)
	t.Cleanup(func() {
		if now, err := loopFileID(device); err == nil && now == id {
			_ = detachLoop(context.Background(), "cleanup", device, "")
		}
	})
}
