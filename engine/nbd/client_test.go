package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

// testServer starts a server on a loopback TCP port and returns it with its
// address and a log hook; it is closed at the end of the test.
func testServer(t testing.TB, opts Options) (*Server, string, *logtest.Hook) {
	t.Helper()
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	if opts.Logger == nil {
		opts.Logger = logger
	}
	srv := NewServer(opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		select {
		case err := <-served:
			require.ErrorIs(t, err, ErrServerClosed)
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return srv, l.Addr().String(), hook
}

// rawConn is a test-side client connection speaking raw protocol.
type rawConn struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

func dial(t testing.TB, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	require.NoError(t, nc.SetDeadline(time.Now().Add(20*time.Second)))
	return &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
}

// greet reads the server greeting and sends client flags.
func (c *rawConn) greet(clientFlags uint32) {
	c.t.Helper()
	var b [18]byte
	_, err := io.ReadFull(c.br, b[:])
	require.NoError(c.t, err)
	require.Equal(c.t, uint64(magicInit), binary.BigEndian.Uint64(b[0:8]))
	require.Equal(c.t, uint64(magicOption), binary.BigEndian.Uint64(b[8:16]))
	require.Equal(c.t, uint16(flagFixedNewstyle|flagNoZeroes), binary.BigEndian.Uint16(b[16:18]))
	c.write(binary.BigEndian.AppendUint32(nil, clientFlags))
}

func (c *rawConn) write(b []byte) {
	c.t.Helper()
	_, err := c.nc.Write(b)
	require.NoError(c.t, err)
}

func (c *rawConn) sendOption(code uint32, data []byte) {
	c.t.Helper()
	c.write(AppendOption(nil, code, data))
}

func (c *rawConn) optReply() OptionReply {
	c.t.Helper()
	r, err := ReadOptionReply(c.br, 1<<20)
	require.NoError(c.t, err)
	return r
}

// expectClosed asserts the server closes the connection without sending
// anything more.
func (c *rawConn) expectClosed() {
	c.t.Helper()
	var b [1]byte
	n, err := c.br.Read(b[:])
	require.Equal(c.t, 0, n, "server sent data instead of closing")
	require.True(c.t, errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isClosedErr(err), "want EOF, got %v", err)
}

// exportInfo is what GO reported.
type exportInfo struct {
	size                 uint64
	flags                uint16
	minBS, prefBS, maxBS uint32
	name, description    string
}

// goExport negotiates NBD_OPT_GO; it returns the error reply type if any.
func (c *rawConn) goExport(name string, infos ...uint16) (exportInfo, uint32) {
	c.t.Helper()
	c.sendOption(OptGo, AppendInfoRequest(nil, InfoRequest{Name: name, Infos: infos}))
	var info exportInfo
	for {
		r := c.optReply()
		require.Equal(c.t, OptGo, r.Code)
		switch {
		case r.Type == RepAck:
			return info, 0
		case r.Type&repFlagError != 0:
			return info, r.Type
		case r.Type == RepInfo:
			require.GreaterOrEqual(c.t, len(r.Data), 2)
			switch binary.BigEndian.Uint16(r.Data) {
			case InfoExport:
				require.Len(c.t, r.Data, 12)
				info.size = binary.BigEndian.Uint64(r.Data[2:])
				info.flags = binary.BigEndian.Uint16(r.Data[10:])
			case InfoBlockSize:
				require.Len(c.t, r.Data, 14)
				info.minBS = binary.BigEndian.Uint32(r.Data[2:])
				info.prefBS = binary.BigEndian.Uint32(r.Data[6:])
				info.maxBS = binary.BigEndian.Uint32(r.Data[10:])
			case InfoName:
				info.name = string(r.Data[2:])
			case InfoDescription:
				info.description = string(r.Data[2:])
			}
		default:
			c.t.Fatalf("unexpected option reply type %#x", r.Type)
		}
	}
}

// connect dials, negotiates GO for name and returns a client.
func connect(t testing.TB, addr, name string) *client {
	t.Helper()
	c := dial(t, addr)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	info, rep := c.goExport(name)
	require.Zero(t, rep, "GO %q failed with reply %#x", name, rep)
	return &client{rawConn: c, size: info.size, flags: info.flags}
}

// client is a transmission-phase test client. Requests may be pipelined with
// send and collected with recv.
type client struct {
	*rawConn
	size   uint64
	flags  uint16
	mu     sync.Mutex
	cookie uint64
}

func (c *client) send(typ, flags uint16, off uint64, length uint32, payload []byte) uint64 {
	c.t.Helper()
	c.mu.Lock()
	c.cookie++
	cookie := c.cookie
	b := AppendRequest(nil, Request{Flags: flags, Type: typ, Cookie: cookie, Offset: off, Length: length})
	c.write(append(b, payload...))
	c.mu.Unlock()
	return cookie
}

// recv reads one simple reply; readLen says how much data to read with a
// successful reply for a given cookie.
func (c *client) recv(readLen func(cookie uint64) uint32) (errno uint32, cookie uint64, data []byte, err error) {
	var h [SimpleReplyHeaderSize]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return 0, 0, nil, err
	}
	errno, cookie, err = ParseSimpleReply(h[:])
	if err != nil {
		return 0, 0, nil, err
	}
	if errno == 0 {
		if n := readLen(cookie); n > 0 {
			data = make([]byte, n)
			if _, err := io.ReadFull(c.br, data); err != nil {
				return 0, 0, nil, err
			}
		}
	}
	return errno, cookie, data, nil
}

// do sends one request and waits for its reply.
func (c *client) do(typ, flags uint16, off uint64, length uint32, payload []byte) (uint32, []byte) {
	c.t.Helper()
	cookie := c.send(typ, flags, off, length, payload)
	errno, got, data, err := c.recv(func(uint64) uint32 {
		if typ == CmdRead {
			return length
		}
		return 0
	})
	require.NoError(c.t, err)
	require.Equal(c.t, cookie, got)
	return errno, data
}

func (c *client) read(off uint64, length uint32) []byte {
	c.t.Helper()
	errno, data := c.do(CmdRead, 0, off, length, nil)
	require.Zero(c.t, errno, "read %d@%d", length, off)
	return data
}

func (c *client) writeAt(p []byte, off uint64) {
	c.t.Helper()
	errno, _ := c.do(CmdWrite, 0, off, uint32(len(p)), p)
	require.Zero(c.t, errno, "write %d@%d", len(p), off)
}

func (c *client) disconnect() {
	c.t.Helper()
	c.send(CmdDisc, 0, 0, 0, nil)
	c.expectClosed()
}

// countingDev wraps a device, counting flushes and optionally gating or
// failing I/O.
type countingDev struct {
	blockdev.Device
	mu        sync.Mutex
	flushes   int
	unmaps    int
	zeroes    int
	writes    int
	delay     time.Duration
	gate      chan struct{} // if set, ReadAt waits on it
	entered   chan struct{} // if set, ReadAt signals entry
	failWrite error
}

func (d *countingDev) Flush() error {
	d.mu.Lock()
	d.flushes++
	d.mu.Unlock()
	return d.Device.Flush()
}

func (d *countingDev) Unmap(off, n int64) error {
	d.mu.Lock()
	d.unmaps++
	d.mu.Unlock()
	return d.Device.Unmap(off, n)
}

func (d *countingDev) WriteZeroes(off, n int64) error {
	d.mu.Lock()
	d.zeroes++
	d.mu.Unlock()
	return d.Device.WriteZeroes(off, n)
}

func (d *countingDev) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	d.writes++
	fail := d.failWrite
	d.mu.Unlock()
	if fail != nil {
		return 0, fail
	}
	return d.Device.WriteAt(p, off)
}

func (d *countingDev) ReadAt(p []byte, off int64) (int, error) {
	if d.entered != nil {
		d.entered <- struct{}{}
	}
	if d.gate != nil {
		<-d.gate
	}
	if d.delay > 0 {
		time.Sleep(d.delay)
	}
	return d.Device.ReadAt(p, off)
}

func (d *countingDev) counts() (flushes, unmaps, zeroes, writes int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.flushes, d.unmaps, d.zeroes, d.writes
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
	return b
}

// must returns v, panicking on err (test setup only).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func bufioReader(nc net.Conn) *bufio.Reader { return bufio.NewReader(nc) }
