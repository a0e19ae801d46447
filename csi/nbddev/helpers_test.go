package nbddev

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/test/need"
)

// testExportSize is the size of the test exports: big enough for ext4 and a
// throughput figure, small enough to stay quick.
const testExportSize = 64 << 20

// requireSystem skips a test that needs what real connections need: root,
// FUSE, loop devices and the tools. Under CI=true (set by .ci/run) a
// missing piece fails the test instead: CI must never pass by skipping.
func requireSystem(tb testing.TB) {
	tb.Helper()
	need.Root(tb, "loop devices, mounts")
	need.File(tb, "/dev/fuse")
	need.File(tb, "/dev/loop-control")
	for tool, pkg := range map[string]string{"nbdfuse": "nbdfuse", "qemu-nbd": "qemu-utils", "qemu-io": "qemu-utils",
		"losetup": "mount", "mkfs.ext4": "e2fsprogs", "mount": "mount", "umount": "mount"} {
		need.Tool(tb, tool, pkg)
	}
}

func testLogger(t testing.TB) logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.DebugLevel)
	l.SetOutput(testWriter{t})
	return l
}

// testWriter sends log lines to t.Log, so they show with the failing test.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// nbdServer is a qemu-nbd serving a sparse raw file as one export on a unix
// socket, standing in for the instance manager's NBD frontend; endpoint is
// what the instance manager would publish (nbd+unix://).
type nbdServer struct {
	endpoint string
	file     string
	socket   string
	args     []string
	cmd      *exec.Cmd
}

// shortDir is a fresh directory for unix sockets, whose paths may not
// exceed 107 bytes (t.TempDir() is named after the test, and may be long).
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nbddev")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startNBDServer serves a fresh 64 MiB file as export name. --persistent
// because nbdfuse and the test tools come and go; --shared so that nbdfuse's
// several connections and a qemu-io can be clients at once.
func startNBDServer(t testing.TB, name string) *nbdServer {
	t.Helper()
	file := filepath.Join(t.TempDir(), name+".img")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.NoError(t, os.Truncate(file, testExportSize))
	socket := filepath.Join(shortDir(t), "nbd.sock")
	s := &nbdServer{
		endpoint: engineapi.UnixNBDEndpoint(socket, name).String(),
		file:     file,
		socket:   socket,
		args: []string{"--format=raw", "--export-name=" + name, "--socket=" + socket,
			"--persistent", "--shared=16", file},
	}
	s.start(t)
	t.Cleanup(func() {
		s.kill()
		left, err := findProcesses("qemu-nbd", func(args []string) bool { return slices.Contains(args, s.file) })
		assert.NoError(t, err)
		assert.Empty(t, left, "qemu-nbd for %s still running", s.file)
	})
	return s
}

func (s *nbdServer) start(t testing.TB) {
	t.Helper()
	logPath := s.file + ".log"
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	require.NoError(t, err)
	defer logf.Close()
	s.cmd = exec.Command("qemu-nbd", s.args...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// Dies with the test binary if that is killed.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, s.cmd.Start())
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", s.socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "qemu-nbd listens on %s; log: %s", s.socket, logTail(logPath))
}

// kill stops the server as a crashed instance manager would stop.
func (s *nbdServer) kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newTestFUSELoop returns a connector on a fresh state directory whose
// cleanup fails the test if anything of it is left (loop device, mount,
// nbdfuse), then removes whatever is left so later tests start clean.
func newTestFUSELoop(t testing.TB) *FUSELoop {
	t.Helper()
	c, err := NewFUSELoop(t.TempDir(), testLogger(t))
	require.NoError(t, err)
	c.exitGrace = 5 * time.Second
	c.exportSuffix = "" // qemu-nbd serves one plain export
	t.Cleanup(func() {
		assert.Empty(t, leftovers(t, c.stateDir), "left behind under %s", c.stateDir)
		forceClean(t, c.stateDir)
		assert.Empty(t, leftovers(t, c.stateDir), "left behind under %s after force-cleaning", c.stateDir)
	})
	return c
}

// leftovers describes every loop device, mount and nbdfuse process that
// belongs to stateDir, as read from the system.
func leftovers(t testing.TB, stateDir string) []string {
	var left []string
	loops, err := loopBackingFiles()
	require.NoError(t, err)
	for backing, dev := range loops {
		if under(backing, stateDir) {
			left = append(left, "loop device "+dev+" -> "+backing)
		}
	}
	entries, err := readMountInfo()
	require.NoError(t, err)
	for _, e := range entries {
		if under(e.MountPoint, stateDir) {
			left = append(left, "mount "+e.MountPoint+" ("+e.FSType+")")
		}
	}
	for _, p := range nbdfuseFor(t, stateDir) {
		left = append(left, fmt.Sprintf("nbdfuse pid %d %v", p.PID, p.Args))
	}
	return left
}

func nbdfuseFor(t testing.TB, stateDir string) []process {
	procs, err := findProcesses("nbdfuse", func(args []string) bool {
		for _, a := range args {
			if under(a, stateDir) {
				return true
			}
		}
		return false
	})
	require.NoError(t, err)
	return procs
}

func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// forceClean tears down whatever a failed test left: mounts of its loop
// devices, the loop devices, FUSE mounts and nbdfuse processes. Not
// t.Context(): that is cancelled before cleanups run.
func forceClean(t testing.TB, stateDir string) {
	ctx := context.Background()
	logIfFailed := func(_ string, err error) {
		if err != nil {
			t.Log("force-cleaning:", err)
		}
	}
	loops, err := loopBackingFiles()
	require.NoError(t, err)
	entries, err := readMountInfo()
	require.NoError(t, err)
	for backing, dev := range loops {
		if !under(backing, stateDir) {
			continue
		}
		points, _ := mountPointsUsing(entries, dev)
		for _, p := range points {
			logIfFailed(run(ctx, "umount", "-l", p))
		}
		logIfFailed(run(ctx, "losetup", "--detach", dev))
	}
	for _, e := range entries {
		if under(e.MountPoint, stateDir) {
			logIfFailed(run(ctx, "umount", "-l", e.MountPoint))
		}
	}
	for _, p := range nbdfuseFor(t, stateDir) {
		if err := stopProcess(p.PID, 0, time.Second); err != nil {
			t.Log("force-cleaning:", err)
		}
	}
	// Autoclear may need a moment once the lazy unmounts let go.
	waitFor(5*time.Second, func() bool { return len(leftovers(t, stateDir)) == 0 })
}

// mountExt4 mounts device on a fresh directory and unmounts it at cleanup
// if the test has not.
func mountExt4(t testing.TB, device string) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "ext4", device, dir).CombinedOutput()
	require.NoError(t, err, "mount %s %s: %s", device, dir, out)
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	return dir
}

func umount(t testing.TB, dir string) {
	t.Helper()
	out, err := exec.Command("umount", dir).CombinedOutput()
	require.NoError(t, err, "umount %s: %s", dir, out)
}

func mkfsExt4(t testing.TB, device string) {
	t.Helper()
	out, err := exec.Command("mkfs.ext4", "-q", "-F", device).CombinedOutput()
	require.NoError(t, err, "mkfs.ext4 %s: %s", device, out)
}

// writeRandomFile writes n random bytes to path, syncs, and returns their hash.
func writeRandomFile(t testing.TB, path string, n int) string {
	t.Helper()
	data := make([]byte, n)
	_, err := rand.Read(data)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	f, err := os.Open(path)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func hashFile(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
