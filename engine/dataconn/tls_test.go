package dataconn

import (
	"bytes"
	"context"
	"crypto/tls"
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
