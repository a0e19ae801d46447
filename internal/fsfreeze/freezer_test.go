package fsfreeze

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/test/need"
)

// ext4 is a real ext4 filesystem on a loop device, mounted.
type ext4 struct {
	image, device, mnt string
}

func needRoot(t *testing.T) { need.Root(t, "to freeze a filesystem") }

func newExt4(t *testing.T) *ext4 {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	fs := &ext4{image: filepath.Join(dir, "disk"), mnt: filepath.Join(dir, "mnt")}
	require.NoError(t, os.WriteFile(fs.image, nil, 0o600))
	require.NoError(t, os.Truncate(fs.image, 64<<20))
	run(t, "mkfs.ext4", "-q", "-F", fs.image)
	fs.device = strings.TrimSpace(run(t, "losetup", "-f", "--show", fs.image))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", fs.device).Run() })
	require.NoError(t, os.Mkdir(fs.mnt, 0o755))
	run(t, "mount", fs.device, fs.mnt)
	t.Cleanup(func() {
		_ = SystemOps.Thaw(fs.mnt)
		// A watchdog's thaw may still hold the mount point open for a moment
		// after the write it let through returned.
		var out []byte
		var err error
		for range 50 {
			if out, err = exec.Command("umount", fs.mnt).CombinedOutput(); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("umount %s: %v: %s", fs.mnt, err, out)
		_ = exec.Command("umount", "-l", fs.mnt).Run()
	})
	return fs
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %v: %s", name, args, out)
	return string(out)
}

func (fs *ext4) resolve(volume string) (Target, error) {
	if volume != "v" {
		return Target{}, nil
	}
	mp, err := MountPointOf(fs.device)
	return Target{Device: fs.device, MountPoint: mp}, err
}

// frozen tells by asking the kernel: a second FIFREEZE is EBUSY.
func (fs *ext4) frozen(t *testing.T) bool {
	t.Helper()
	err := SystemOps.Freeze(fs.mnt)
	if err == nil {
		require.NoError(t, SystemOps.Thaw(fs.mnt))
		return false
	}
	require.ErrorIs(t, err, unix.EBUSY)
	return true
}

// onDisk reads a file from the filesystem's image, not through the mount:
// what a snapshot cut now would hold.
func (fs *ext4) onDisk(t *testing.T, name string) string {
	t.Helper()
	out, _ := exec.Command("debugfs", "-R", "cat /"+name, fs.image).Output()
	return string(out)
}

func newFreezer(t *testing.T, fs *ext4, dir string) *Freezer {
	return New(dir, fs.resolve, SystemOps, logrus.StandardLogger())
}

// writeUnsynced writes a new file and checks it is only in the page cache,
// not yet in the image. Any process's sync(2) writes back every
// filesystem of the host (make test runs the cluster suites beside this
// package, and their Pods sync), so a file seen written back before the
// freeze is replaced by a new one, a few times at most.
func writeUnsynced(t *testing.T, fs *ext4, content string) string {
	t.Helper()
	for i := range 5 {
		name := fmt.Sprintf("hello-%d", i)
		require.NoError(t, os.WriteFile(filepath.Join(fs.mnt, name), []byte(content), 0o644))
		if fs.onDisk(t, name) == "" {
			return name
		}
	}
	require.FailNow(t, "five files in a row were written back before they could be read from the image")
	return ""
}

// A freeze writes out what the application wrote without fsync, holds
// new writes until the thaw, and the thaw lets them through.
func TestFreezeHoldsWhatWasWritten(t *testing.T) {
	fs := newExt4(t)
	f := newFreezer(t, fs, t.TempDir())
	name := writeUnsynced(t, fs, "written, not synced\n")

	c, err := f.Freeze(context.Background(), "v", "cut-1", 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, Filesystem, c)
	assert.True(t, fs.frozen(t))
	assert.Equal(t, "written, not synced\n", fs.onDisk(t, name), "frozen: the image holds the file")
	wrote := make(chan error, 1)
	go func() { wrote <- os.WriteFile(filepath.Join(fs.mnt, "later"), []byte("x"), 0o644) }()

	_, err = f.Freeze(context.Background(), "v", "cut-2", 10*time.Second)
	assert.ErrorIs(t, err, ErrBusy, "a second cut waits its turn")
	require.NoError(t, f.Thaw("v", "cut-1"))
	require.NoError(t, <-wrote)
	assert.False(t, fs.frozen(t))
	require.NoError(t, f.Thaw("v", "cut-1"), "a thaw again is success")
	entries, _ := os.ReadDir(f.dir)
	assert.Empty(t, entries, "no freeze record left")
}

// The watchdog thaws a freeze its caller never ends, and the late thaw
// says so.
func TestFreezeWatchdog(t *testing.T) {
	fs := newExt4(t)
	f := newFreezer(t, fs, t.TempDir())
	_, err := f.Freeze(context.Background(), "v", "cut", 300*time.Millisecond)
	require.NoError(t, err)
	// The write waits for the thaw; the hang guard is not a bound.
	wrote := make(chan error, 1)
	go func() { wrote <- os.WriteFile(filepath.Join(fs.mnt, "w"), []byte("x"), 0o644) }()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the watchdog never thawed")
	}
	assert.ErrorIs(t, f.Thaw("v", "cut"), ErrExpired)
}

// A freezer killed while a filesystem is frozen: the next one thaws it
// from its record before serving.
func TestRecoverThawsAfterKill(t *testing.T) {
	fs := newExt4(t)
	dir := t.TempDir()
	killed := newFreezer(t, fs, dir)
	_, err := killed.Freeze(context.Background(), "v", "cut", MaxTimeout)
	require.NoError(t, err)
	require.True(t, fs.frozen(t))

	restarted := newFreezer(t, fs, dir)
	require.NoError(t, restarted.Recover())
	assert.False(t, fs.frozen(t), "thawed at start")
	entries, _ := os.ReadDir(dir)
	assert.Empty(t, entries, "record gone")
	require.NoError(t, os.WriteFile(filepath.Join(fs.mnt, "w"), []byte("x"), 0o644))
}

// A filesystem whose FIFREEZE never returns (its device hangs): the
// freeze fails at its timeout, the volume stays busy, and once FIFREEZE
// returns the filesystem is thawed at once.
func TestHungFreezeFailsAndThawsLater(t *testing.T) {
	release := make(chan struct{})
	thawed := make(chan string, 1)
	ops := Ops{
		Freeze: func(string) error { <-release; return nil },
		Thaw:   func(mp string) error { thawed <- mp; return nil },
		Flush:  func(string) error { return nil },
	}
	dir := t.TempDir()
	f := New(dir, func(string) (Target, error) { return Target{Device: "/dev/x", MountPoint: "/mnt/x"}, nil }, ops, logrus.StandardLogger())
	start := time.Now()
	_, err := f.Freeze(context.Background(), "v", "cut", 200*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "volume v: freezing /mnt/x: no answer in 200ms")
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	_, err = f.Freeze(context.Background(), "v", "cut-2", time.Second)
	assert.ErrorIs(t, err, ErrBusy, "no second freeze stacks on a hung one")
	_, err = f.Freeze(context.Background(), "v", "cut", time.Second)
	assert.ErrorIs(t, err, ErrBusy, "the hung cut asked again is not frozen")
	require.NoError(t, f.Thaw("v", "cut"), "the caller's thaw is success; the late freeze is thawed by itself")
	_, err = os.Stat(filepath.Join(dir, "v.json"))
	require.NoError(t, err, "the record stays while FIFREEZE may still freeze")

	close(release)
	assert.Equal(t, "/mnt/x", <-thawed)
	require.Eventually(t, func() bool {
		_, err := f.Freeze(context.Background(), "v", "cut-3", time.Second)
		return err == nil
	}, time.Minute, 10*time.Millisecond, "the volume can be frozen again")
}

// Not staged here: cut as a power cut would; a block device: flushed.
func TestFreezeTargets(t *testing.T) {
	flushed := ""
	ops := Ops{Freeze: func(string) error { return errors.New("no") }, Thaw: func(string) error { return nil },
		Flush: func(d string) error { flushed = d; return nil }}
	targets := map[string]Target{"raw": {Device: "/dev/loop9"}, "absent": {}}
	f := New(t.TempDir(), func(v string) (Target, error) { return targets[v], nil }, ops, logrus.StandardLogger())
	for _, tc := range []struct {
		volume  string
		timeout time.Duration
		want    Consistency
		err     string
	}{
		{"absent", time.Second, Crash, ""},
		{"raw", time.Second, Flushed, ""},
		{"raw", 0, "", "timeout 0s: must be above 0 and at most 1m0s"},
		{"raw", 2 * MaxTimeout, "", "timeout 2m0s: must be above 0"},
		{"../etc", time.Second, "", `volume "../etc": must be a non-empty name without '/'`},
		{"", time.Second, "", `volume "": must be a non-empty name`},
	} {
		t.Run(tc.volume+"/"+tc.timeout.String(), func(t *testing.T) {
			got, err := f.Freeze(context.Background(), tc.volume, "cut", tc.timeout)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	assert.Equal(t, "/dev/loop9", flushed)
}

// Over the socket, as the instance manager asks.
func TestServeAndClient(t *testing.T) {
	fs := newExt4(t)
	f := newFreezer(t, fs, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	socket := filepath.Join(t.TempDir(), "run", "fsfreeze.sock")
	served := make(chan error, 1)
	go func() { served <- f.Serve(ctx, socket) }()
	c := NewClient(socket)
	require.Eventually(t, func() bool { _, err := os.Stat(socket); return err == nil }, time.Minute, 10*time.Millisecond)

	got, err := c.Freeze(ctx, "v", "cut", 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, Filesystem, got)
	assert.True(t, fs.frozen(t))
	require.NoError(t, c.Thaw(ctx, "v", "cut"))
	assert.False(t, fs.frozen(t))
	_, err = c.Freeze(ctx, "v", "cut", 0)
	assert.ErrorContains(t, err, "timeout 0s: must be above 0")
	got, err = c.Freeze(ctx, "other", "cut", time.Second)
	require.NoError(t, err)
	assert.Equal(t, Crash, got)

	cancel()
	require.NoError(t, <-served)
	_, err = NewClient(socket).Freeze(context.Background(), "v", "cut", time.Second)
	assert.ErrorIs(t, err, ErrNoPlugin, "no socket: no plugin on the node")

	// A socket left by a killed plugin: an error to retry, not a silent
	// crash-consistent cut.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	_, err = NewClient(socket).Freeze(context.Background(), "v", "cut", time.Second)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNoPlugin)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
}
