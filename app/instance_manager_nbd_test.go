package app

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckNBDListen(t *testing.T) {
	tests := []struct {
		addr    string
		wantMsg string // empty: allowed
	}{
		{"127.0.0.1:10809", ""},
		{"127.0.0.2:10809", ""},
		{"127.255.255.254:0", ""},
		{"[::1]:10809", ""},
		{"[::ffff:127.0.0.1]:10809", ""},
		{"0.0.0.0:10809", "0.0.0.0 is not a loopback address"},
		{"[::]:10809", ":: is not a loopback address"},
		{":10809", "no host means every interface"},
		{"10.0.0.5:10809", "10.0.0.5 is not a loopback address"},
		{"192.168.1.1:10809", "is not a loopback address"},
		{"[fe80::1]:10809", "is not a loopback address"},
		{"localhost:10809", "must be an IP address, not a name"},
		{"nbd.example.com:10809", "must be an IP address"},
		{"127.0.0.1", "missing port"},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			err := checkNBDListen(tt.addr)
			if tt.wantMsg == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantMsg)
			assert.Contains(t, err.Error(), "--nbd-listen")
			assert.Contains(t, err.Error(), "loopback-only")
			assert.Contains(t, err.Error(), "no authentication")
		})
	}
}

func TestNBDListeners(t *testing.T) {
	log := logrus.New()
	dir := filepath.Join(t.TempDir(), "im-nbd")
	socket := filepath.Join(dir, "nbd.sock")

	_, _, err := nbdListeners(socket, "0.0.0.0:0", log)
	require.ErrorContains(t, err, "loopback-only", "refused before anything is made")
	assert.NoDirExists(t, dir)
	_, _, err = nbdListeners("", "", log)
	require.ErrorContains(t, err, "--nbd-socket is required")

	path, ls, err := nbdListeners(socket, "127.0.0.1:0", log)
	require.NoError(t, err)
	assert.Equal(t, socket, path)
	require.Len(t, ls, 2, "the unix socket and the TCP listener asked for")
	assert.Equal(t, "tcp", ls[1].Addr().Network())
	for p, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, socket: 0o600 | os.ModeSocket} {
		st, err := os.Stat(p)
		require.NoError(t, err)
		assert.Equal(t, want, st.Mode()&(os.ModeType|os.ModePerm), p)
	}

	_, _, err = nbdListeners(socket, "", log)
	require.ErrorContains(t, err, "another process serves this socket", "a live socket is kept")
	for _, l := range ls {
		require.NoError(t, l.Close())
	}
	assert.NoFileExists(t, socket, "closing removes the socket")

	// A socket left by a killed instance manager is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	require.NoError(t, err)
	stale.SetUnlinkOnClose(false)
	require.NoError(t, stale.Close())
	_, ls, err = nbdListeners(socket, "", log)
	require.NoError(t, err, "a stale socket is replaced")
	require.Len(t, ls, 1, "no TCP unless asked")
	require.NoError(t, ls[0].Close())

	long := filepath.Join(t.TempDir(), strings.Repeat("d", 100), "nbd.sock")
	_, _, err = nbdListeners(long, "", log)
	require.ErrorContains(t, err, "over the 107 a unix socket path may have")
}
