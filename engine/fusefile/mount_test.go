package fusefile

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/replica"
)

const uringParam = "/sys/module/fuse/parameters/enable_uring"

// withURing sets the kernel's fuse.enable_uring for the test and puts it
// back after.
func withURing(t *testing.T, on bool) {
	t.Helper()
	old, err := os.ReadFile(uringParam)
	require.NoError(t, err, "this kernel has no FUSE over io_uring parameter")
	want := "N"
	if on {
		want = "Y"
	}
	require.NoError(t, os.WriteFile(uringParam, []byte(want), 0))
	t.Cleanup(func() { _ = os.WriteFile(uringParam, bytes.TrimSpace(old), 0) })
}

func mountMem(t *testing.T, size int64, opts Options) (*Server, *blockdev.Mem) {
	t.Helper()
	dev := blockdev.NewMem(size)
	log := logrus.New()
	log.SetOutput(testWriter{t})
	opts.Log = log
	s, err := Mount(t.TempDir(), dev, opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s, dev
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// The file reads and writes the device's bytes, with and without direct
// I/O, over io_uring queues where the kernel has them on and over
// /dev/fuse reads where not; a punched hole reads back as zeros.
func TestFileIsTheDevice(t *testing.T) {
	for _, tc := range []struct {
		name      string
		uring     bool
		wantURing bool
	}{{"io_uring queues", true, true}, {"classic /dev/fuse", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			withURing(t, tc.uring)
			s, dev := mountMem(t, 8<<20, Options{})
			assert.Equal(t, tc.wantURing, s.UsesIOURing())
			st, err := os.Stat(s.Path())
			require.NoError(t, err)
			assert.EqualValues(t, 8<<20, st.Size())

			data := make([]byte, 1<<20)
			_, _ = rand.Read(data)
			f := openRaw(t, s.Path(), os.O_RDWR|syscall.O_DIRECT)
			_, err = f.WriteAt(alignedCopy(data), 3<<20)
			require.NoError(t, err)
			require.NoError(t, f.Sync())
			got := make([]byte, len(data))
			_, err = dev.ReadAt(got, 3<<20)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, got), "the device holds what was written through the file")

			back := alignedCopy(make([]byte, len(data)))
			_, err = f.ReadAt(back, 3<<20)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, back), "the file reads the device")

			require.NoError(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 3<<20, 4096))
			_, err = f.ReadAt(back[:4096], 3<<20)
			require.NoError(t, err)
			assert.Equal(t, make([]byte, 4096), back[:4096], "a punched hole reads as zeros")

			_, err = f.WriteAt(alignedCopy(data[:4096]), 8<<20)
			assert.ErrorIs(t, err, syscall.ENOSPC, "the file does not grow past the device")
			names, err := os.ReadDir(filepath.Dir(s.Path()))
			require.NoError(t, err)
			require.Len(t, names, 1)
			assert.Equal(t, "disk", names[0].Name())
		})
	}
}

// openRaw opens the served file as a plain blocking descriptor, outside
// the runtime's poller (which would ask the file by FUSE_POLL), so the
// test sees plain reads and writes only.
func openRaw(t *testing.T, path string, flags int) *os.File {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), path) // blocking fd: not added to the poller
	t.Cleanup(func() { f.Close() })
	return f
}

// alignedCopy returns b's bytes in page-aligned memory, as O_DIRECT needs.
func alignedCopy(b []byte) []byte {
	out, err := unix.Mmap(-1, 0, len(b), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	copy(out, b)
	return out
}

// What the node plugin builds on it: a loop device in direct-I/O mode and
// ext4 on that; a file written there reads back after a remount.
func TestLoopDeviceAndExt4OnTheFile(t *testing.T) {
	withURing(t, true)
	s, _ := mountMem(t, 64<<20, Options{})
	loop, mnt, run := ext4OnLoop(t, s.Path())
	// Runs before the loop device's detach (cleanups run last first).
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	data := make([]byte, 5<<20)
	_, _ = rand.Read(data)
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "f"), data, 0o600))
	run("umount", mnt)
	run("mount", loop, mnt)
	got, err := os.ReadFile(filepath.Join(mnt, "f"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got), "the file reads back after a remount")
	run("fstrim", mnt) // discards reach the server as punched holes
	run("umount", mnt)
}

// Closing the server while a loop device still holds the file does not
// hang: the connection is aborted and the loop device sees errors.
func TestCloseWhileInUse(t *testing.T) {
	withURing(t, true)
	dev := blockdev.NewMem(8 << 20)
	s, err := Mount(t.TempDir(), dev, Options{Log: logrus.New()})
	require.NoError(t, err)
	f := openRaw(t, s.Path(), os.O_RDWR)
	require.NoError(t, s.Close())
	_, err = f.ReadAt(make([]byte, 4096), 0)
	assert.Error(t, err, "the aborted connection answers no more")
}

// CleanStale unmounts a mount whose server is gone, and leaves a plain
// directory and a missing one alone.
func TestCleanStale(t *testing.T) {
	withURing(t, false)
	plain := t.TempDir()
	require.NoError(t, CleanStale(plain))
	require.NoError(t, CleanStale(filepath.Join(plain, "missing")))

	dir := t.TempDir()
	s, err := Mount(dir, blockdev.NewMem(1<<20), Options{Log: logrus.New()})
	require.NoError(t, err)
	require.NoError(t, CleanStale(dir), "a live mount is unmounted too: callers know it is not theirs")
	_, err = os.Stat(s.Path())
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing is mounted there any more")
	require.NoError(t, s.Close())
}

// Issue 43 point 2, end to end: ext4 on a loop device on the file of a
// replica of 128 MiB; 64 MiB written and synced; a snapshot kept; rm and
// fstrim. The loop device sends the discards as punched holes, which must
// not allocate the snapshot's data again in the head; deleting the
// snapshot then frees it.
func TestTrimUnderSnapshotThroughLoopDevice(t *testing.T) {
	withURing(t, true)
	r, err := replica.Create(filepath.Join(t.TempDir(), "r"), 128<<20, replica.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() }) // after the unmount and the detach below
	log := logrus.New()
	log.SetOutput(testWriter{t})
	s, err := Mount(t.TempDir(), r, Options{Log: log})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	loop, mnt, run := ext4OnLoop(t, s.Path())
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	data := make([]byte, 64<<20)
	_, _ = rand.Read(data)
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "f"), data, 0o600))
	run("sync", "-f", mnt)
	require.NoError(t, r.Snapshot("s", replica.SnapshotOptions{UserCreated: true}))
	before := headSize(t, r)

	require.NoError(t, os.Remove(filepath.Join(mnt, "f")))
	run("sync", "-f", mnt)
	run("fstrim", mnt)
	run("sync", "-f", mnt)
	after := headSize(t, r)
	info, err := r.Chain()
	require.NoError(t, err)
	t.Logf("head: %d KiB after the snapshot, %d KiB after rm + fstrim; snapshot s: %d KiB",
		before>>10, after>>10, info.Layers[0].Size>>10)
	assert.Less(t, after-before, int64(4<<20), "the trim allocates next to nothing (ext4's own metadata writes)")

	run("umount", mnt)
	require.NoError(t, r.RemoveSnapshot("s"))
	require.NoError(t, r.Purge(context.Background(), nil))
	info, err = r.Chain()
	require.NoError(t, err)
	var total int64
	for _, l := range info.Layers {
		total += l.Size
	}
	t.Logf("after the snapshot's delete and purge: %d layer(s), %d KiB", len(info.Layers), total>>10)
	assert.Less(t, total, int64(16<<20), "the trimmed 64 MiB is freed: what is left is ext4's metadata")
	run("mount", loop, mnt)
	_, err = os.Stat(filepath.Join(mnt, "f"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the file system is intact, the file gone")
	run("umount", mnt)
}

// ext4OnLoop makes ext4 on a direct-I/O loop device on file and mounts it,
// as the node plugin does; run runs a command that must succeed. The
// caller registers the unmount: cleanups run last first, so it runs
// before the detach registered here.
func ext4OnLoop(t *testing.T, file string) (loop, mnt string, run func(args ...string)) {
	t.Helper()
	out, err := exec.Command("losetup", "-f", "--show", "--direct-io=on", file).CombinedOutput()
	require.NoError(t, err, string(out))
	loop = strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	run = func(args ...string) {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
	}
	run("mkfs.ext4", "-q", "-F", loop)
	mnt = t.TempDir()
	run("mount", loop, mnt)
	return loop, mnt, run
}
