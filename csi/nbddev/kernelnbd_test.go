package nbddev

// The kernel nbd connector cannot run here (no nbd module, no /dev/nbd*):
// these tests cover what does not need the module.

import (
	"github.com/strata-storage/strata/internal/atomicfile"

	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeSysfs builds <root>/block/<name>/{size,pid} for each device; an
// empty pid means no pid attribute (not connected).
func fakeSysfs(t *testing.T, devices map[string][2]string) string {
	root := t.TempDir()
	for name, attrs := range devices {
		dir := filepath.Join(root, "block", name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "size"), []byte(attrs[0]+"\n"), 0o644))
		if attrs[1] != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "pid"), []byte(attrs[1]+"\n"), 0o644))
		}
	}
	return root
}

func TestFreeNBDDevices(t *testing.T) {
	tests := []struct {
		name    string
		devices map[string][2]string // name -> {size, pid}
		want    []string
	}{
		{"none", map[string][2]string{}, nil},
		{"all free, numeric order", map[string][2]string{
			"nbd10": {"0", ""}, "nbd2": {"0", ""}, "nbd1": {"0", ""},
		}, []string{"nbd1", "nbd2", "nbd10"}},
		{"connected and settling devices skipped", map[string][2]string{
			"nbd0": {"2097152", "1234"}, // connected
			"nbd1": {"0", "99"},         // pid set before size: being connected
			"nbd2": {"2048", ""},        // size not yet cleared: being disconnected
			"nbd3": {"0", ""},
		}, []string{"nbd3"}},
		{"partitions skipped", map[string][2]string{
			"nbd0p1": {"0", ""}, "nbd0": {"0", ""},
		}, []string{"nbd0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := freeNBDDevices(fakeSysfs(t, tt.devices))
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestNewPicksConnectorBySystem(t *testing.T) {
	tests := []struct {
		name             string
		module, devNode  bool
		wantKernelClient bool
	}{
		{"module and device node", true, true, true},
		{"module without device node (container without /dev/nbd*)", true, false, false},
		{"no module", false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sysRoot, devRoot := t.TempDir(), t.TempDir()
			if tt.module {
				require.NoError(t, os.MkdirAll(filepath.Join(sysRoot, "module", "nbd"), 0o755))
			}
			if tt.devNode {
				require.NoError(t, os.WriteFile(filepath.Join(devRoot, "nbd0"), nil, 0o600))
			}
			require.Equal(t, tt.wantKernelClient, kernelNBDAvailable(sysRoot, devRoot))
		})
	}
	// On this machine: whichever applies, New must say which and work.
	c, err := New(Options{StateDir: t.TempDir()}, testLogger(t))
	require.NoError(t, err)
	_, isKernel := c.(*KernelNBD)
	require.Equal(t, kernelNBDAvailable("/sys", "/dev"), isKernel)
}

func TestConnectArg(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--connect=/dev/nbd3", "--format=raw", "nbd://h:1/v"}, "/dev/nbd3"},
		{[]string{"-c", "/dev/nbd0", "x"}, "/dev/nbd0"},
		{[]string{"--connect", "/dev/nbd1"}, "/dev/nbd1"},
		{[]string{"-x", "v", "--port=1", "file"}, ""},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, connectArg(tt.args), "%v", tt.args)
	}
}

// TestKernelNBDRecordNeedsALiveConnection: a device record whose device
// sysfs shows as unconnected, or connected by a process that is not a
// qemu-nbd for that device, is not a connection.
func TestKernelNBDRecordNeedsALiveConnection(t *testing.T) {
	sleeper := exec.Command("sleep", "60")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, sleeper.Start())
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })

	sysRoot := fakeSysfs(t, map[string][2]string{
		"nbd0": {"0", ""},
		"nbd1": {"2048", fmt.Sprint(sleeper.Process.Pid)}, // a pid, but not qemu-nbd's
	})
	c := &KernelNBD{stateDir: t.TempDir(), sysRoot: sysRoot, devRoot: "/dev", log: testLogger(t)}
	for id, dev := range map[string]string{"v0": "/dev/nbd0", "v1": "/dev/nbd1"} {
		require.NoError(t, atomicfile.WriteFile(c.deviceFile(id), []byte(dev+"\n")))
		require.NoError(t, atomicfile.WriteFile(c.endpointFile(id), []byte("nbd://127.0.0.1:1/"+id+"\n")))
		_, ok, err := c.Device(id)
		require.NoError(t, err)
		require.False(t, ok, "%s on %s is not connected", id, dev)
	}
	all, err := c.Connected()
	require.NoError(t, err)
	require.Empty(t, all)
	// Disconnect of a stale record only removes the record.
	require.NoError(t, c.Disconnect(t.Context(), "v0"))
	require.NoFileExists(t, c.deviceFile("v0"))
}

// TestQemuNBDOpensNBDURIs checks the image half of the --connect command
// line: qemu-nbd given exactly qemuNBDImageArgs(endpoint) opens the export.
// Serving it again instead of --connect needs no module; a write through
// the re-export is read back from the original.
func TestQemuNBDOpensNBDURIs(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	port := freePort(t)
	args := append([]string{"--export-name=re", "--bind=127.0.0.1", fmt.Sprintf("--port=%d", port), "--persistent"},
		qemuNBDImageArgs(srv.endpoint)...)
	re := exec.Command("qemu-nbd", args...)
	logPath := filepath.Join(t.TempDir(), "re.log")
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	defer logf.Close()
	re.Stdout, re.Stderr = logf, logf
	re.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, re.Start())
	t.Cleanup(func() { _ = re.Process.Kill(); _ = re.Wait() })

	reEndpoint := fmt.Sprintf("nbd://127.0.0.1:%d/re", port)
	require.Eventually(t, func() bool {
		return exec.Command("qemu-io", "-f", "raw", "-c", "write -P 0x7e 1M 64k", reEndpoint).Run() == nil
	}, 10*time.Second, 50*time.Millisecond, "qemu-nbd %v serves; log: %s", args, logTail(logPath))
	res, err := exec.Command("qemu-io", "-f", "raw", "-c", "read -P 0x7e 1M 64k", srv.endpoint).CombinedOutput()
	require.NoError(t, err, "%s", res)
	require.NotContains(t, string(res), "Pattern verification failed")
}

// TestKernelNBDConnectFailureIsReported runs the real qemu-nbd --connect
// command line against a device node that is not an nbd device (there is
// none here): the error names the volume and the command with qemu-nbd's
// output, and no record is left behind.
func TestKernelNBDConnectFailureIsReported(t *testing.T) {
	requireSystem(t)
	srv := startNBDServer(t, "vol1")
	devRoot := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(devRoot, "nbd0"), nil, 0o600))
	c := &KernelNBD{stateDir: t.TempDir(), sysRoot: fakeSysfs(t, map[string][2]string{"nbd0": {"0", ""}}),
		devRoot: devRoot, log: testLogger(t)}
	_, err := c.Connect(t.Context(), "vol1", srv.endpoint)
	require.Error(t, err)
	t.Log(err)
	require.ErrorContains(t, err, "volume vol1")
	require.ErrorContains(t, err, "qemu-nbd --connect="+filepath.Join(devRoot, "nbd0"))
	require.ErrorContains(t, err, srv.endpoint)
	require.NoFileExists(t, c.deviceFile("vol1"))
	require.NoFileExists(t, c.endpointFile("vol1"))
}
