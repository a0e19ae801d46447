package dataconn

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startPending starts calls in every state a connection can hold them:
// WRITEs running on the device (blocked by the gate), a FLUSH barrier
// waiting for them in the server's reader, and READs queued behind the
// barrier. It returns their results channel and how many there are.
func startPending(t *testing.T, c *Client, dev *gateDev) (<-chan error, int) {
	const writes, reads = 20, 5
	var enqueued atomic.Int32
	setHook(c, func(*call) { enqueued.Add(1) })
	results := make(chan error, writes+1+reads)
	for i := range writes {
		go func() {
			_, err := c.WriteAt(make([]byte, 4096), int64(i*4096))
			results <- err
		}()
	}
	require.Eventually(t, func() bool { return dev.waitingWrites() == writes }, 5*time.Second, time.Millisecond)
	go func() { results <- c.Flush() }()
	for range reads {
		go func() {
			_, err := c.ReadAt(make([]byte, 512), 0)
			results <- err
		}()
	}
	// Every call is pending in the client (the writes are inside the
	// device, the flush and reads queued behind them) before the break.
	require.Eventually(t, func() bool { return enqueued.Load() == writes+1+reads }, hangGuard, time.Millisecond)
	return results, writes + 1 + reads
}

// expectAllClosed waits for n results, each ErrConnectionClosed.
func expectAllClosed(t *testing.T, results <-chan error, n int) {
	t.Helper()
	deadline := time.After(hangGuard)
	for i := range n {
		select {
		case err := <-results:
			require.ErrorIs(t, err, ErrConnectionClosed, "result %d", i)
		case <-deadline:
			t.Fatalf("only %d of %d pending calls failed", i, n)
		}
	}
}

// expectBroken: the client says its connection is gone, and a new call
// fails with that at once instead of going to the network: with no call
// timeout (the tests' default) such a call would never return, and with
// one it would fail with ErrTimeout, not ErrConnectionClosed.
func expectBroken(t *testing.T, c *Client) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(hangGuard):
		t.Fatal("Done not closed")
	}
	require.ErrorIs(t, c.Err(), ErrConnectionClosed)
	var readErr, pingErr error
	noHang(t, "a call on a broken connection", func() {
		_, readErr = c.ReadAt(make([]byte, 1), 0)
		pingErr = c.Ping(context.Background())
	})
	require.ErrorIs(t, readErr, ErrConnectionClosed)
	require.ErrorIs(t, pingErr, ErrConnectionClosed)
}

func TestServerKilledMidStream(t *testing.T) {
	checkGoroutines(t)
	dev := newGateDev()
	srv, addr := startServer(t, &testHandler{Device: dev}, nil)
	t.Cleanup(dev.open)
	c := dial(t, addr, Options{})
	results, n := startPending(t, c, dev)

	closed := make(chan struct{})
	go func() {
		srv.Close()
		close(closed)
	}()
	expectAllClosed(t, results, n)
	expectBroken(t, c)

	select {
	case <-closed:
		t.Fatal("Server.Close returned while device calls were still running")
	default:
	}
	dev.open()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Server.Close did not return once the device calls did")
	}
}

func TestClientCloseFailsPendingCalls(t *testing.T) {
	checkGoroutines(t)
	dev := newGateDev()
	_, addr := startServer(t, &testHandler{Device: dev}, nil)
	t.Cleanup(dev.open)
	c := dial(t, addr, Options{})
	results, n := startPending(t, c, dev)

	require.NoError(t, c.Close())
	expectAllClosed(t, results, n)
	expectBroken(t, c)
	require.NoError(t, c.Close(), "Close is idempotent")
	dev.open() // the server's connection then winds down on its own
}

// fakeServer accepts one connection, answers the handshake like a real
// server, then hands the connection to behave.
func fakeServer(t *testing.T, behave func(conn net.Conn, br *bufio.Reader)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		h, _, err := ReadRequest(br, nil)
		if err != nil || h.Op != OpSize {
			return
		}
		reply := AppendResponseHeader(nil, ResponseHeader{Seq: h.Seq, PayloadLen: 8})
		if _, err := conn.Write(be.AppendUint64(reply, 1<<20)); err != nil {
			return
		}
		behave(conn, br)
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return l.Addr().String()
}

func TestMisbehavingServer(t *testing.T) {
	respond := func(conn net.Conn, h ResponseHeader, payload []byte) {
		conn.Write(append(AppendResponseHeader(nil, h), payload...))
	}
	tests := []struct {
		name     string
		protocol bool // the failure is a protocol error
		behave   func(conn net.Conn, h RequestHeader)
	}{
		{"closes", false, func(conn net.Conn, h RequestHeader) {}},
		{"resets", false, func(conn net.Conn, h RequestHeader) { conn.(*net.TCPConn).SetLinger(0) }},
		{"closes mid-header", false, func(conn net.Conn, h RequestHeader) {
			conn.Write(AppendResponseHeader(nil, ResponseHeader{Seq: h.Seq, PayloadLen: h.Length})[:10])
		}},
		{"closes mid-payload", false, func(conn net.Conn, h RequestHeader) {
			respond(conn, ResponseHeader{Seq: h.Seq, PayloadLen: h.Length}, make([]byte, 100))
		}},
		{"bad magic", true, func(conn net.Conn, h RequestHeader) {
			conn.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		}},
		{"unknown seq", true, func(conn net.Conn, h RequestHeader) {
			respond(conn, ResponseHeader{Seq: 1 << 40}, nil)
		}},
		{"wrong READ length", true, func(conn net.Conn, h RequestHeader) {
			respond(conn, ResponseHeader{Seq: h.Seq, PayloadLen: 10}, make([]byte, 10))
		}},
		{"oversized error message", true, func(conn net.Conn, h RequestHeader) {
			respond(conn, ResponseHeader{Seq: h.Seq, Status: StatusError, PayloadLen: MaxErrorLen + 1}, nil)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			gotRequest := make(chan struct{})
			addr := fakeServer(t, func(conn net.Conn, br *bufio.Reader) {
				h, _, err := ReadRequest(br, nil)
				close(gotRequest)
				if err == nil {
					tc.behave(conn, h)
				}
				if tc.protocol {
					// Closing with the client's later requests unread would
					// reset the connection, and the client might lose the
					// bad response to the reset: keep reading until the
					// client, having seen it, hangs up.
					_, _ = io.Copy(io.Discard, br)
				}
			})
			c := dial(t, addr, Options{})
			const n = 8
			results := make(chan error, n)
			for range n {
				go func() {
					_, err := c.ReadAt(make([]byte, 4096), 0)
					results <- err
				}()
			}
			<-gotRequest
			expectAllClosed(t, results, n)
			expectBroken(t, c)
			if tc.protocol {
				assert.ErrorIs(t, c.Err(), ErrProtocol)
			}
		})
	}
}

// TestStalledPeer: the peer stops reading, so a large WRITE sits in the
// socket. The call must still return on time, without the client keeping
// its buffer, by giving up on the connection.
func TestStalledPeer(t *testing.T) {
	checkGoroutines(t)
	release := make(chan struct{})
	addr := fakeServer(t, func(net.Conn, *bufio.Reader) { <-release })
	defer close(release)
	c := dial(t, addr, Options{Timeout: 100 * time.Millisecond, StallTimeout: 300 * time.Millisecond})

	// The peer never reads until the test ends: only the client's own
	// timeouts can end the call.
	var err error
	noHang(t, "a write to a stalled peer", func() {
		_, err = c.WriteAt(make([]byte, MaxIOSize), 0) // more than the socket buffers hold
	})
	require.ErrorIs(t, err, ErrTimeout)
	expectBroken(t, c)
}

func TestDialFailures(t *testing.T) {
	checkGoroutines(t)
	ctx := context.Background()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := l.Addr().String()
	l.Close()
	_, err = Dial(ctx, closedAddr, Options{Log: testLog()})
	require.Error(t, err)

	garbage := fakeServerRaw(t, func(conn net.Conn) { conn.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n")) })
	_, err = Dial(ctx, garbage, Options{Log: testLog()})
	require.ErrorIs(t, err, ErrProtocol)

	// A server that accepts and never answers until the test ends: only
	// the context can end the dial.
	release := make(chan struct{})
	silent := fakeServerRaw(t, func(conn net.Conn) { <-release })
	defer close(release)
	ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	noHang(t, "a dial to a silent server", func() { _, err = Dial(ctx, silent, Options{Log: testLog()}) })
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// fakeServerRaw accepts one connection and hands it to behave as is.
func fakeServerRaw(t *testing.T, behave func(conn net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		behave(conn)
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return l.Addr().String()
}
