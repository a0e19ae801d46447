package dataconn

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/internal/pki"
)

// testTLS is the pair of configs instance managers use for data
// connections: both ends instance-manager identities of one CA.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	ca, err := pki.NewCAState(time.Now())
	require.NoError(t, err)
	src := func(node string) *pki.MemorySource {
		c, err := pki.IssueIdentity(ca.Current, pki.Identity{Component: pki.ComponentInstanceManager, Node: node}, nil, time.Now())
		require.NoError(t, err)
		var m pki.MemorySource
		m.Set(c, ca.Bundle)
		return &m
	}
	return pki.ServerConfig(src("a"), pki.ComponentInstanceManager), pki.ClientConfig(src("b"), pki.ComponentInstanceManager)
}

func TestTLSDataConnection(t *testing.T) {
	for _, unencrypted := range []bool{false, true} {
		t.Run(map[bool]string{false: "encrypted", true: "authenticated only"}[unencrypted], func(t *testing.T) {
			testTLSDataConnection(t, unencrypted)
		})
	}
}

func testTLSDataConnection(t *testing.T, unencrypted bool) {
	server, client := testTLS(t)
	mem := blockdev.NewMem(1 << 20)
	_, addr := startServer(t, &testHandler{Device: mem}, nil, WithTLS(server))

	c := dial(t, addr, Options{TLS: client, Unencrypted: unencrypted})
	data := bytes.Repeat([]byte("strata"), 20000)
	_, err := c.WriteAt(data, 4096)
	require.NoError(t, err)
	got := make([]byte, len(data))
	_, err = c.ReadAt(got, 4096)
	require.NoError(t, err)
	assert.Equal(t, data, got)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = Dial(ctx, addr, Options{Log: testLog()})
	assert.Error(t, err, "a plain client is refused")
	_, other := testTLS(t)
	_, err = Dial(ctx, addr, Options{Log: testLog(), TLS: other, Unencrypted: unencrypted})
	assert.Error(t, err, "a client of another CA is refused")
	got2 := make([]byte, 6)
	_, err = mem.ReadAt(got2, 4096)
	require.NoError(t, err)
	assert.Equal(t, []byte("strata"), got2, "refused clients changed nothing")
}

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestEncryptedFrameGoesOutInFewWrites: crypto/tls seals at most 16 KiB
// per record and writes each record by itself; the frame writer gathers a
// frame's records, so 1 MiB goes to the socket in a handful of writes, not
// 64 (what made TLS cost more in system calls than in AES-GCM).
func TestEncryptedFrameGoesOutInFewWrites(t *testing.T) {
	server, client := testTLS(t)
	mem := blockdev.NewMem(4 << 20)
	_, addr := startServer(t, &testHandler{Device: mem}, nil, WithTLS(server))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	require.NoError(t, err)
	counted := &countingConn{Conn: raw}
	conn, err := clientHandshake(ctx, counted, Options{TLS: client})
	require.NoError(t, err)
	c := newClient(conn, addr, Options{Log: testLog()})
	t.Cleanup(func() { c.Close() })

	data := pattern(7, 1<<20)
	before := counted.writes.Load()
	_, err = c.WriteAt(data, 1<<20)
	require.NoError(t, err)
	writes := counted.writes.Load() - before
	assert.LessOrEqual(t, writes, int64(1<<20/gatherLimit+2), "socket writes for one 1 MiB frame")

	got := make([]byte, len(data))
	_, err = c.ReadAt(got, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, data, got, "the gathered records decrypt to the frame")
}
