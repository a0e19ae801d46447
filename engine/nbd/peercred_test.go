package nbd

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/test/need"
)

// servePeerUID serves NBD on l wrapped in a PeerUIDListener letting allowed
// in, and returns the log hook.
func servePeerUID(t *testing.T, l net.Listener, allowed ...uint32) *logtest.Hook {
	t.Helper()
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	srv := NewServer(Options{Logger: logger})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(PeerUIDListener(l, logger, allowed...)) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		select {
		case err := <-served:
			require.ErrorIs(t, err, ErrServerClosed)
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return hook
}

func warnings(hook *logtest.Hook) []logrus.Entry {
	var out []logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			out = append(out, *e)
		}
	}
	return out
}

// greeting reads what the server first says on a new connection: NBD's
// magic if it serves it, nothing (EOF) if it was refused.
func greeting(t *testing.T, network, addr string) (string, error) {
	t.Helper()
	nc, err := net.Dial(network, addr)
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
	buf := make([]byte, 8)
	_, err = io.ReadFull(nc, buf)
	return string(buf), err
}

func TestPeerUIDListener(t *testing.T) {
	me := uint32(os.Getuid())
	tests := []struct {
		name    string
		allowed []uint32
		served  bool
	}{
		{"own uid", []uint32{me}, true},
		{"own uid among others", []uint32{4242, me}, true},
		{"another uid only", []uint32{me + 4242}, false},
		{"nobody", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "nbd.sock")
			l, err := net.Listen("unix", path)
			require.NoError(t, err)
			hook := servePeerUID(t, l, tt.allowed...)
			got, err := greeting(t, "unix", path)
			if tt.served {
				require.NoError(t, err)
				assert.Equal(t, "NBDMAGIC", got)
				assert.Empty(t, warnings(hook), "nothing refused")
				require.Eventually(t, func() bool {
					for _, e := range hook.AllEntries() {
						if e.Data["remote"] != nil {
							return e.Data["remote"] == fmt.Sprintf("pid=%d,uid=%d", os.Getpid(), me)
						}
					}
					return false
				}, 5*time.Second, 10*time.Millisecond, "the connection's log names the peer process")
				return
			}
			require.ErrorIs(t, err, io.EOF, "closed before the handshake")
			require.Eventually(t, func() bool { return len(warnings(hook)) > 0 }, 5*time.Second, 10*time.Millisecond)
			e := warnings(hook)[0]
			assert.Contains(t, e.Message, "Refused an NBD connection")
			assert.Equal(t, me, e.Data["uid"])
			assert.Equal(t, int32(os.Getpid()), e.Data["pid"], "the test process connected")
			// The listener goes on serving: the next connection gets the same answer.
			_, err = greeting(t, "unix", path)
			require.ErrorIs(t, err, io.EOF)
		})
	}
}

// A connection whose credentials cannot be read (not a unix socket) is refused.
func TestPeerUIDListenerRefusesWithoutCredentials(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hook := servePeerUID(t, l, uint32(os.Getuid()))
	_, err = greeting(t, "tcp", l.Addr().String())
	require.ErrorIs(t, err, io.EOF)
	require.Eventually(t, func() bool { return len(warnings(hook)) > 0 }, 5*time.Second, 10*time.Millisecond)
	assert.Contains(t, warnings(hook)[0].Message, "cannot read its peer credentials")
}

func TestOwnUIDs(t *testing.T) {
	uids := OwnUIDs()
	assert.Contains(t, uids, uint32(os.Getuid()))
	assert.Contains(t, uids, uint32(0), "root may always connect")
}

// The real thing, as root: a process of another user (nobody) that can
// reach the socket file (the mode allows it here, as it must not on a node)
// is still refused, by the uid the kernel reports; root's own connection is
// served.
func TestPeerUIDListenerRefusesAnotherUser(t *testing.T) {
	if os.Getenv(dialHelperEnv) != "" {
		t.Skip("in the helper process")
	}
	need.Root(t, "to run a process as another user")
	dir, err := os.MkdirTemp("", "nbd-peercred-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	path := filepath.Join(dir, "nbd.sock")
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(path, 0o666))
	hook := servePeerUID(t, l, OwnUIDs()...)

	const nobody = 65534
	// The test binary's own directory is root's only: nobody runs a copy.
	bin := filepath.Join(dir, "helper.test")
	self, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, self, 0o755))
	cmd := exec.Command(bin, "-test.run=^TestPeerUIDDialHelper$", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), dialHelperEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "refused: EOF", "nobody connected and was closed on")
	require.Eventually(t, func() bool { return len(warnings(hook)) > 0 }, 5*time.Second, 10*time.Millisecond)
	e := warnings(hook)[0]
	assert.Equal(t, uint32(nobody), e.Data["uid"])
	assert.Equal(t, int32(cmd.Process.Pid), e.Data["pid"])

	got, err := greeting(t, "unix", path)
	require.NoError(t, err, "root is served")
	assert.Equal(t, "NBDMAGIC", got)
}

const dialHelperEnv = "STRATA_NBD_PEERCRED_DIAL"

// TestPeerUIDDialHelper is the other user's process of the test above.
func TestPeerUIDDialHelper(t *testing.T) {
	path := os.Getenv(dialHelperEnv)
	if path == "" {
		t.Skip("helper process for TestPeerUIDListenerRefusesAnotherUser")
	}
	nc, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
	buf := make([]byte, 8)
	if _, err := io.ReadFull(nc, buf); err != nil {
		fmt.Println("refused:", err)
		return
	}
	fmt.Printf("served: %q\n", buf)
}
