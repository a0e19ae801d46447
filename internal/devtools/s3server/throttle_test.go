package s3server

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// echoServer answers every connection with what it reads.
func echoServer(t *testing.T) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return &Server{addr: ln.Addr().String()}
}

func TestThrottle(t *testing.T) {
	const size = 256 << 10
	for _, tc := range []struct {
		name string
		rate int
		// The token bucket cannot go faster than its rate after the
		// first burst: both directions share it.
		atLeast time.Duration
	}{
		{name: "full speed", rate: 0},
		{name: "1 MiB/s", rate: 1 << 20, atLeast: time.Duration(float64(2*size-chunk) / float64(1<<20) * float64(time.Second))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th, err := NewThrottle(echoServer(t), tc.rate)
			require.NoError(t, err)
			defer th.Close()
			c, err := net.Dial("tcp", th.Endpoint[len("http://"):])
			require.NoError(t, err)
			defer c.Close()
			want := make([]byte, size)
			_, _ = rand.Read(want)
			start := time.Now()
			go func() { _, _ = c.Write(want) }()
			got := make([]byte, size)
			_, err = io.ReadFull(c, got)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, got), "the bytes come back unchanged")
			assert.GreaterOrEqual(t, time.Since(start), tc.atLeast)
		})
	}
}

func TestThrottleCloseCutsConnections(t *testing.T) {
	th, err := NewThrottle(echoServer(t), 1024)
	require.NoError(t, err)
	c, err := net.Dial("tcp", th.Endpoint[len("http://"):])
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	require.NoError(t, th.Close())
	// Ended by a close or a reset, not left hanging.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadAll(c)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the client sees its connection end: %v", err)
}
