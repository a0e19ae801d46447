package nbddev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
)

// requireConnected checks, from the system, that volume is fully up on dev.
func requireConnected(t *testing.T, c Connector, volumeID, dev string) {
	t.Helper()
	got, ok, err := c.Device(volumeID)
	require.NoError(t, err)
	require.True(t, ok, "Device(%s) finds the connection", volumeID)
	require.Equal(t, dev, got)
	all, err := c.Connected()
	require.NoError(t, err)
	require.Equal(t, dev, all[volumeID], "Connected lists %s", volumeID)
}

// requireGone checks that nothing of volume is left on the system or in
// the state directory.
func requireGone(t *testing.T, c *FUSELoop, volumeID string) {
	t.Helper()
	_, ok, err := c.Device(volumeID)
	require.NoError(t, err)
	require.False(t, ok, "Device(%s) after Disconnect", volumeID)
	all, err := c.Connected()
	require.NoError(t, err)
	require.NotContains(t, all, volumeID)
	st, err := c.inspect(volumeID)
	require.NoError(t, err)
	require.False(t, st.active(), "pieces of %s left: %+v", volumeID, st)
	for _, p := range []string{c.mountDir(volumeID), c.endpointFile(volumeID), c.logFile(volumeID)} {
		require.NoFileExists(t, p)
		require.NoDirExists(t, p)
	}
}

// TestFilesystemSurvivesReconnect is the CSI node's round trip: a block
// device, a filesystem on it, data written, everything torn down, and the
// data back through a new connection by a new Connector value.
func TestFilesystemSurvivesReconnect(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	c := newTestFUSELoop(t)
	ctx := t.Context()

	start := time.Now()
	dev, err := c.Connect(ctx, "vol1", srv.endpoint)
	require.NoError(t, err)
	t.Logf("first Connect took %v -> %s", time.Since(start).Round(time.Millisecond), dev)
	require.True(t, strings.HasPrefix(dev, "/dev/loop"), dev)
	requireConnected(t, c, "vol1", dev)

	mkfsExt4(t, dev)
	mnt := mountExt4(t, dev)
	sum := writeRandomFile(t, filepath.Join(mnt, "data"), 8<<20)
	umount(t, mnt)
	start = time.Now()
	require.NoError(t, c.Disconnect(ctx, "vol1"))
	t.Logf("Disconnect took %v", time.Since(start).Round(time.Millisecond))
	requireGone(t, c, "vol1")

	c2, err := NewFUSELoop(c.stateDir, testLogger(t))
	require.NoError(t, err)
	c2.exportSuffix = c.exportSuffix
	start = time.Now()
	dev2, err := c2.Connect(ctx, "vol1", srv.endpoint)
	require.NoError(t, err)
	t.Logf("second Connect took %v -> %s", time.Since(start).Round(time.Millisecond), dev2)
	mnt = mountExt4(t, dev2)
	require.Equal(t, sum, hashFile(t, filepath.Join(mnt, "data")))
	umount(t, mnt)
	require.NoError(t, c2.Disconnect(ctx, "vol1"))
	requireGone(t, c2, "vol1")
}

func TestConnectIsIdempotent(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	other := startNBDServer(t, "vol2")
	c := newTestFUSELoop(t)
	ctx := t.Context()

	dev, err := c.Connect(ctx, "vol1", srv.endpoint)
	require.NoError(t, err)
	again, err := c.Connect(ctx, "vol1", srv.endpoint)
	require.NoError(t, err)
	require.Equal(t, dev, again, "a second Connect returns the same device")

	_, err = c.Connect(ctx, "vol1", other.endpoint)
	require.Error(t, err)
	require.ErrorContains(t, err, srv.endpoint)
	require.ErrorContains(t, err, other.endpoint)
	requireConnected(t, c, "vol1", dev)

	require.NoError(t, c.Disconnect(ctx, "vol1"))
	require.NoError(t, c.Disconnect(ctx, "vol1"), "a second Disconnect is not an error")
	requireGone(t, c, "vol1")
	require.NoError(t, c.Disconnect(ctx, "never-connected"))
}

// TestDisconnectRefusesInUseDevice covers both ways the kubelet uses a
// device: a filesystem mounted on it (staging) and its node bind-mounted
// onto a file (raw block publish). Either must stop Disconnect before it
// changes anything.
func TestDisconnectRefusesInUseDevice(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	c := newTestFUSELoop(t)
	ctx := t.Context()
	dev, err := c.Connect(ctx, "vol1", srv.endpoint)
	require.NoError(t, err)
	mkfsExt4(t, dev)

	tests := []struct {
		name  string
		mount func(t *testing.T) string // returns the mount point
	}{
		{"filesystem", func(t *testing.T) string { return mountExt4(t, dev) }},
		{"bind-mounted device node", func(t *testing.T) string {
			target := filepath.Join(t.TempDir(), "block")
			require.NoError(t, os.WriteFile(target, nil, 0o600))
			out, err := exec.Command("mount", "--bind", dev, target).CombinedOutput()
			require.NoError(t, err, "mount --bind: %s", out)
			return target
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			point := tt.mount(t)
			err := c.Disconnect(ctx, "vol1")
			require.Error(t, err)
			require.ErrorContains(t, err, point)
			require.ErrorContains(t, err, dev)
			requireConnected(t, c, "vol1", dev)
			st, err := c.inspect("vol1")
			require.NoError(t, err)
			require.True(t, st.healthy(), "nothing torn down: %+v", st)
			umount(t, point)
		})
	}
	require.NoError(t, c.Disconnect(ctx, "vol1"))
	requireGone(t, c, "vol1")
}

// Environment of the helper process that plays a CSI plugin killed -9.
const (
	helperEnv         = "NBDDEV_TEST_HELPER"
	helperStateDir    = "NBDDEV_TEST_STATE_DIR"
	helperEndpointEnv = "NBDDEV_TEST_ENDPOINT"
	helperCrashAtEnv  = "NBDDEV_TEST_CRASH_AT"
)

// TestHelperProcess is not a test: run by runKilledConnect in a child
// process, it connects "vol1" and SIGKILLs itself at the named step.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for the crash tests")
	}
	c, err := NewFUSELoop(os.Getenv(helperStateDir), logrus.StandardLogger())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	c.exportSuffix = "" // qemu-nbd serves one plain export
	crashAt := os.Getenv(helperCrashAtEnv)
	c.crashPoint = func(step string) {
		if step == crashAt {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	_, err = c.Connect(context.Background(), "vol1", os.Getenv(helperEndpointEnv))
	fmt.Fprintln(os.Stderr, "helper: Connect returned without crashing:", err)
	os.Exit(3)
}

// runKilledConnect runs Connect in another process that is killed -9 right
// after step, as a plugin restarted at the worst moment.
func runKilledConnect(t *testing.T, stateDir, endpoint, step string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperStateDir+"="+stateDir,
		helperEndpointEnv+"="+endpoint, helperCrashAtEnv+"="+step)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "helper failed to run: %v; output: %s", err, out.String())
	status := exit.Sys().(syscall.WaitStatus)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL,
		"helper died of SIGKILL at %s, got %v; output: %s", step, err, out.String())
}

// TestRecoveryAfterPluginKill kills a Connect in another process after each
// of its steps. A new Connector must then see exactly what is there, and
// either a Connect completes the connection or a Disconnect removes all of it.
func TestRecoveryAfterPluginKill(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	steps := []struct {
		step       string
		hasDevice  bool // the loop device was bound before the kill
		hasNBDFUSE bool // nbdfuse was up before the kill
	}{
		{stepEndpointRecorded, false, false},
		{stepFUSEReady, false, true},
		{stepLoopAttached, true, true},
	}
	for _, s := range steps {
		for _, recovery := range []string{"connect", "disconnect"} {
			t.Run(s.step+"/"+recovery, func(t *testing.T) {
				c := newTestFUSELoop(t)
				runKilledConnect(t, c.stateDir, srv.endpoint, s.step)

				dev, ok, err := c.Device("vol1")
				require.NoError(t, err)
				require.Equal(t, s.hasDevice, ok, "Device after a kill at %s", s.step)
				st, err := c.inspect("vol1")
				require.NoError(t, err)
				require.Equal(t, s.hasNBDFUSE, st.mounted && len(st.daemons) == 1,
					"nbdfuse outlives the killed plugin: %+v", st)
				if recovery == "connect" {
					got, err := c.Connect(t.Context(), "vol1", srv.endpoint)
					require.NoError(t, err)
					if s.hasDevice {
						require.Equal(t, dev, got, "the existing device is reused")
					}
					requireConnected(t, c, "vol1", got)
					requireDeviceIO(t, got)
				}
				require.NoError(t, c.Disconnect(t.Context(), "vol1"))
				requireGone(t, c, "vol1")
			})
		}
	}
}

// requireDeviceIO writes a pattern through the device and reads it back
// bypassing the page cache.
func requireDeviceIO(t *testing.T, dev string) {
	t.Helper()
	out, err := exec.Command("sh", "-c", fmt.Sprintf(
		"printf 'strata-nbddev' | dd of=%[1]s bs=4096 conv=sync,fsync oflag=direct status=none && "+
			"dd if=%[1]s bs=4096 count=1 iflag=direct status=none | head -c 13", dev)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "strata-nbddev", string(out))
}

// TestNBDFUSEThatDiesIsReplaced: a dead nbdfuse leaves a stale mount and a
// dead loop device; Connect replaces both with a working connection.
func TestNBDFUSEThatDiesIsReplaced(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	c := newTestFUSELoop(t)
	_, err := c.Connect(t.Context(), "vol1", srv.endpoint)
	require.NoError(t, err)
	st, err := c.inspect("vol1")
	require.NoError(t, err)
	require.Len(t, st.daemons, 1)
	pid := st.daemons[0].PID
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.True(t, waitFor(5*time.Second, func() bool { return processGone(pid) }), "nbdfuse %d exits on SIGKILL", pid)

	dev, err := c.Connect(t.Context(), "vol1", srv.endpoint)
	require.NoError(t, err)
	requireConnected(t, c, "vol1", dev)
	requireDeviceIO(t, dev)
	require.NoError(t, c.Disconnect(t.Context(), "vol1"))
	requireGone(t, c, "vol1")
}

// TestDeadConnectionIsReplaced: when the export's server goes away, nbdfuse
// stays up and fails every request, even once the server is back (over TCP;
// over a unix socket libnbd 1.14's nbdfuse aborts at the next request). A Connect
// then finds processes and mounts in place but a device that does not
// answer: it replaces the connection, or refuses while the device is in
// use, naming where.
func TestDeadConnectionIsReplaced(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	c := newTestFUSELoop(t)
	c.probeTimeout = 2 * time.Second
	dev, err := c.Connect(t.Context(), "vol1", srv.endpoint)
	require.NoError(t, err)
	srv.kill()
	srv.start(t)
	require.Error(t, probeDevice(dev, time.Second), "the old connection is dead")

	target := filepath.Join(t.TempDir(), "block")
	require.NoError(t, os.WriteFile(target, nil, 0o600))
	out, err := exec.Command("mount", "--bind", dev, target).CombinedOutput()
	require.NoError(t, err, "mount --bind: %s", out)
	_, err = c.Connect(t.Context(), "vol1", srv.endpoint)
	require.ErrorContains(t, err, target)
	require.ErrorContains(t, err, "dead")
	umount(t, target)

	dev, err = c.Connect(t.Context(), "vol1", srv.endpoint)
	require.NoError(t, err)
	requireConnected(t, c, "vol1", dev)
	requireDeviceIO(t, dev)
	require.NoError(t, c.Disconnect(t.Context(), "vol1"))
	requireGone(t, c, "vol1")
}

// TestConnectFailsClearly: an export that does not exist makes nbdfuse
// exit; the error says so with its log, and nothing is left.
func TestConnectFailsClearly(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	c := newTestFUSELoop(t)
	bad, err := withExportSuffix(srv.endpoint, "-no-such-export")
	require.NoError(t, err)
	_, err = c.Connect(t.Context(), "vol1", bad)
	require.Error(t, err)
	t.Log(err)
	require.ErrorContains(t, err, "vol1")
	require.ErrorContains(t, err, bad)
	require.ErrorContains(t, err, "exited")
	st, err := c.inspect("vol1")
	require.NoError(t, err)
	require.False(t, st.active(), "%+v", st)
	require.NoError(t, c.Disconnect(t.Context(), "vol1"))
	requireGone(t, c, "vol1")
}

func TestValidation(t *testing.T) {
	c := &FUSELoop{stateDir: t.TempDir(), log: logrus.New()}
	tests := []struct {
		name, volumeID, endpoint, wantErr string
	}{
		{"slash", "a/b", "nbd://127.0.0.1:1/a", "volumeID"},
		{"dot-dot", "..", "nbd://127.0.0.1:1/a", "volumeID"},
		{"upper case", "Vol1", "nbd://127.0.0.1:1/a", "volumeID"},
		{"empty", "", "nbd://127.0.0.1:1/a", "volumeID"},
		{"state file suffix", "a.log", "nbd://127.0.0.1:1/a", "reserved"},
		{"too long", strings.Repeat("a", maxVolumeIDLen+1), "nbd://127.0.0.1:1/a", "volumeID"},
		{"wrong scheme", "v1", "tcp://127.0.0.1:1/a", "endpoint"},
		{"no export", "v1", "nbd://127.0.0.1:1/", "endpoint"},
		{"no host", "v1", "nbd:///a", "endpoint"},
		{"unix, no export", "v1", "nbd+unix:///?socket=/run/nbd.sock", "no export name"},
		{"unix, no socket", "v1", "nbd+unix:///a", "socket"},
		{"unix, relative socket", "v1", "nbd+unix:///a?socket=run/nbd.sock", "must be an absolute path"},
		{"unix, dot-dot", "v1", "nbd+unix:///a?socket=/run/../tmp/nbd.sock", "must not contain .."},
		{"unix, tls", "v1", "nbds+unix:///a?socket=/run/nbd.sock", "scheme"},
		{"unix, more parameters", "v1", "nbd+unix:///a?socket=/run/nbd.sock&tls=on", "exactly one query parameter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Connect(t.Context(), tt.volumeID, tt.endpoint)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	require.NoError(t, validateVolumeID("pvc-0123abcd.v1"))
}

// BenchmarkThroughput: 64 MiB written and read with dd (1 MiB, O_DIRECT)
// through the loop device, against qemu-io straight to the same export,
// the baseline measured in the same run (go test's MB/s column; the loop
// path's ratio to the export is what matters). The dd source is a random
// file already in the page cache, so its cost is not measured; qemu-io's
// figures include its start (~0.1 s).
//
//	go test -run '^$' -bench Throughput ./csi/nbddev/
func BenchmarkThroughput(b *testing.B) {
	requireSystem(b)
	srv := startNBDServer(b, "vol1")
	c := newTestFUSELoop(b)
	dev, err := c.Connect(b.Context(), "vol1", srv.endpoint)
	require.NoError(b, err)
	defer func() { require.NoError(b, c.Disconnect(context.Background(), "vol1")) }()
	src := filepath.Join(b.TempDir(), "random")
	writeRandomFile(b, src, testExportSize)
	for _, r := range []struct {
		what string
		cmd  []string
	}{
		{"export/qemu-io-write-1x64MiB", []string{"qemu-io", "-f", "raw", "-c", "write -P 0x5a 0 64M", srv.endpoint}},
		{"export/qemu-io-read-1x64MiB", []string{"qemu-io", "-f", "raw", "-c", "read 0 64M", srv.endpoint}},
		{"export/qemu-io-write-64x1MiB", qemuIOSweep(srv.endpoint, "write -P 0xa5")},
		{"export/qemu-io-read-64x1MiB", qemuIOSweep(srv.endpoint, "read")},
		{"loop/dd-write", []string{"dd", "if=" + src, "of=" + dev, "bs=1M", "oflag=direct", "conv=fsync", "status=none"}},
		{"loop/dd-read", []string{"dd", "if=" + dev, "of=/dev/null", "bs=1M", "iflag=direct", "status=none"}},
	} {
		b.Run(r.what, func(b *testing.B) {
			b.SetBytes(testExportSize)
			for b.Loop() {
				out, err := exec.Command(r.cmd[0], r.cmd[1:]...).CombinedOutput()
				require.NoError(b, err, "%v: %s", r.cmd, out)
			}
		})
	}
}

// qemuIOSweep covers the export in 1 MiB requests, one at a time.
func qemuIOSweep(endpoint, op string) []string {
	args := []string{"qemu-io", "-f", "raw"}
	for off := 0; off < testExportSize; off += 1 << 20 {
		args = append(args, "-c", fmt.Sprintf("%s %d 1M", op, off))
	}
	return append(args, endpoint)
}
