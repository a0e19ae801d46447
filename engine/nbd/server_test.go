package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

const testSize = 4 << 20

func logged(hook *logtest.Hook, level logrus.Level, substr string) bool {
	for _, e := range hook.AllEntries() {
		if e.Level > level {
			continue
		}
		if strings.Contains(e.Message, substr) {
			return true
		}
		for _, v := range e.Data {
			if err, ok := v.(error); ok && strings.Contains(err.Error(), substr) {
				return true
			}
			if s, ok := v.(string); ok && strings.Contains(s, substr) {
				return true
			}
		}
	}
	return false
}

func TestHandshakeGo(t *testing.T) {
	srv, addr, _ := testServer(t, Options{})
	require.NoError(t, srv.AddExport("disk", blockdev.NewMem(testSize), Description("test disk")))
	require.NoError(t, srv.AddExport("ro", blockdev.NewMem(8192), ReadOnly()))

	c := dial(t, addr)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	info, rep := c.goExport("disk", InfoName, InfoDescription, InfoBlockSize)
	require.Zero(t, rep)
	assert.Equal(t, uint64(testSize), info.size)
	want := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagCanMultiConn
	assert.Equal(t, want, info.flags)
	assert.Equal(t, [3]uint32{1, 4096, 32 << 20}, [3]uint32{info.minBS, info.prefBS, info.maxBS})
	assert.Equal(t, "disk", info.name)
	assert.Equal(t, "test disk", info.description)

	// Transmission works after GO.
	cl := &client{rawConn: c, size: info.size}
	cl.writeAt([]byte("hello"), 100)
	assert.Equal(t, []byte("hello"), cl.read(100, 5))
	cl.disconnect()

	// INFO then GO on the same connection; read-only flags.
	c = dial(t, addr)
	c.greet(flagCFixedNewstyle)
	c.sendOption(OptInfo, AppendInfoRequest(nil, InfoRequest{Name: "ro"}))
	var sawExport bool
	for {
		r := c.optReply()
		require.Equal(t, OptInfo, r.Code)
		if r.Type == RepAck {
			break
		}
		require.Equal(t, RepInfo, r.Type)
		if binary.BigEndian.Uint16(r.Data) == InfoExport {
			sawExport = true
			assert.Equal(t, uint64(8192), binary.BigEndian.Uint64(r.Data[2:]))
			assert.Equal(t, FlagHasFlags|FlagReadOnly|FlagSendFlush|FlagSendFUA|FlagCanMultiConn, binary.BigEndian.Uint16(r.Data[10:]))
		}
	}
	assert.True(t, sawExport, "NBD_INFO_EXPORT missing from the INFO reply")
	info, rep = c.goExport("ro")
	require.Zero(t, rep)
	cl = &client{rawConn: c, size: info.size}
	errno, _ := cl.do(CmdWrite, 0, 0, 1, []byte{1})
	assert.Equal(t, EPERM, errno)
	errno, _ = cl.do(CmdTrim, 0, 0, 4096, nil)
	assert.Equal(t, EPERM, errno)
	assert.Len(t, cl.read(0, 4096), 4096)
}

func TestHandshakeExportName(t *testing.T) {
	srv, addr, _ := testServer(t, Options{})
	require.NoError(t, srv.AddExport("disk", blockdev.NewMem(testSize)))
	for _, noZeroes := range []bool{false, true} {
		c := dial(t, addr)
		flags := uint32(flagCFixedNewstyle)
		if noZeroes {
			flags |= flagCNoZeroes
		}
		c.greet(flags)
		c.sendOption(OptExportName, []byte("disk"))
		n := 10
		if !noZeroes {
			n += 124
		}
		b := make([]byte, n)
		_, err := io.ReadFull(c.br, b)
		require.NoError(t, err)
		assert.Equal(t, uint64(testSize), binary.BigEndian.Uint64(b))
		assert.NotZero(t, binary.BigEndian.Uint16(b[8:])&FlagHasFlags)
		assert.Equal(t, make([]byte, n-10), b[10:])
		cl := &client{rawConn: c}
		// The next bytes must be the reply to this read, not leftover zeroes.
		cl.writeAt([]byte{7}, 0)
		assert.Equal(t, []byte{7}, cl.read(0, 1), "noZeroes=%v", noZeroes)
		cl.disconnect()
	}
}

func TestHandshakeErrors(t *testing.T) {
	srv, addr, hook := testServer(t, Options{})
	require.NoError(t, srv.AddExport("disk", blockdev.NewMem(testSize)))
	require.NoError(t, srv.AddExport("b", blockdev.NewMem(4096)))

	t.Run("unknown option then go", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle)
		for _, code := range []uint32{999, OptStartTLS, OptExtendedHeaders} {
			c.sendOption(code, []byte("junk"))
			r := c.optReply()
			assert.Equal(t, code, r.Code)
			assert.Equal(t, RepErrUnsup, r.Type)
			assert.NotEmpty(t, r.Data, "error replies carry a message")
		}
		c.sendOption(OptStructuredReply, nil)
		assert.Equal(t, RepErrUnsup, c.optReply().Type)
		c.sendOption(OptStructuredReply, []byte{1})
		assert.Equal(t, RepErrInvalid, c.optReply().Type)
		c.sendOption(OptSetMetaContext, []byte{0, 0, 0, 0})
		assert.Equal(t, RepErrInvalid, c.optReply().Type)
		_, rep := c.goExport("disk")
		assert.Zero(t, rep)
	})
	t.Run("export not found", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle)
		_, rep := c.goExport("nope")
		assert.Equal(t, RepErrUnknown, rep)
		c.sendOption(OptInfo, AppendInfoRequest(nil, InfoRequest{Name: "nope"}))
		r := c.optReply()
		assert.Equal(t, RepErrUnknown, r.Type)
		assert.Contains(t, string(r.Data), `"nope"`)
		// No default export configured.
		_, rep = c.goExport("")
		assert.Equal(t, RepErrUnknown, rep)
		// EXPORT_NAME cannot report errors: the server hangs up.
		c.sendOption(OptExportName, []byte("nope"))
		c.expectClosed()
		assert.True(t, logged(hook, logrus.WarnLevel, `export "nope" not found`))
	})
	t.Run("list", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle)
		c.sendOption(OptList, nil)
		var names []string
		for {
			r := c.optReply()
			if r.Type == RepAck {
				break
			}
			require.Equal(t, RepServer, r.Type)
			n := binary.BigEndian.Uint32(r.Data)
			names = append(names, string(r.Data[4:4+n]))
		}
		assert.Equal(t, []string{"b", "disk"}, names)
		c.sendOption(OptList, []byte{1})
		assert.Equal(t, RepErrInvalid, c.optReply().Type)
	})
	t.Run("abort", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle)
		c.sendOption(OptAbort, nil)
		r := c.optReply()
		assert.Equal(t, OptAbort, r.Code)
		assert.Equal(t, RepAck, r.Type)
		c.expectClosed()
	})
	t.Run("malformed go", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle)
		for _, data := range [][]byte{
			nil,
			{0, 0, 0, 4, 'd', 'i'},           // name overruns
			{0, 0, 0, 4, 'd', 'i', 's', 'k'}, // no info count
			{0, 0, 0, 4, 'd', 'i', 's', 'k', 0, 2, 0},    // info list short
			{0xff, 0xff, 0xff, 0xff, 'd', 'i', 's', 'k'}, // huge name length
		} {
			c.sendOption(OptGo, data)
			assert.Equal(t, RepErrInvalid, c.optReply().Type, "data %x", data)
		}
		_, rep := c.goExport("b")
		assert.Zero(t, rep)
	})
	t.Run("oversized option", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle)
		c.sendOption(OptGo, make([]byte, MaxOptionLen+1))
		assert.Equal(t, RepErrTooBig, c.optReply().Type)
		_, rep := c.goExport("disk")
		assert.Zero(t, rep)
	})
	t.Run("bad option magic", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle)
		b := AppendOption(nil, OptGo, nil)
		b[0] ^= 0xff
		c.write(b)
		c.expectClosed()
	})
	t.Run("unknown client flags", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle | 1<<7)
		c.expectClosed()
	})
	t.Run("not fixed newstyle", func(t *testing.T) {
		c := dial(t, addr)
		c.greet(0)
		c.expectClosed()
	})
	t.Run("handshake timeout", func(t *testing.T) {
		_, addr, hook := testServer(t, Options{HandshakeTimeout: 200 * time.Millisecond})
		c := dial(t, addr)
		c.greet(flagCFixedNewstyle)
		// The client never finishes the handshake: only the server's timeout
		// ends it. The read deadline is a hang guard, far beyond 200 ms.
		require.NoError(t, c.nc.SetReadDeadline(time.Now().Add(time.Minute)))
		c.expectClosed()
		require.Eventually(t, func() bool { return logged(hook, logrus.WarnLevel, "timeout") }, 5*time.Second, 10*time.Millisecond)
	})
}

func TestDefaultExport(t *testing.T) {
	srv, addr, _ := testServer(t, Options{})
	require.NoError(t, srv.AddExport("vol", blockdev.NewMem(8192), Default()))
	require.Error(t, srv.AddExport("other", blockdev.NewMem(8192), Default()), "two defaults")
	require.Error(t, srv.AddExport("vol", blockdev.NewMem(8192)), "duplicate name")
	c := connect(t, addr, "")
	assert.Equal(t, uint64(8192), c.size)
	c.writeAt([]byte{1, 2, 3}, 0)
	c2 := connect(t, addr, "vol")
	assert.Equal(t, []byte{1, 2, 3}, c2.read(0, 3))

	// An export named "" takes precedence.
	require.NoError(t, srv.AddExport("", blockdev.NewMem(4096)))
	c3 := connect(t, addr, "")
	assert.Equal(t, uint64(4096), c3.size)
}

func TestCommands(t *testing.T) {
	mem := blockdev.NewMem(testSize)
	dev := &countingDev{Device: mem}
	srv, addr, hook := testServer(t, Options{})
	require.NoError(t, srv.AddExport("disk", dev))
	c := connect(t, addr, "disk")

	data := pattern(3*4096+17, 1)
	c.writeAt(data, 5000)
	assert.Equal(t, data, c.read(5000, uint32(len(data))))
	got := make([]byte, len(data))
	must(mem.ReadAt(got, 5000))
	assert.Equal(t, data, got, "the write reached the device")

	tests := []struct {
		name    string
		typ     uint16
		flags   uint16
		off     uint64
		length  uint32
		payload []byte
		errno   uint32
	}{
		{"read at end", CmdRead, 0, testSize - 10, 10, nil, 0},
		{"read zero length at end", CmdRead, 0, testSize, 0, nil, 0},
		{"read past end", CmdRead, 0, testSize - 10, 11, nil, EINVAL},
		{"read offset past end", CmdRead, 0, testSize + 1, 0, nil, EINVAL},
		{"read offset overflow", CmdRead, 0, 1<<64 - 1, 2, nil, EINVAL},
		{"read oversize", CmdRead, 0, 0, MaxPayload + 1, nil, EINVAL},
		{"read with flags", CmdRead, CmdFlagDF, 0, 1, nil, EINVAL},
		{"write past end", CmdWrite, 0, testSize - 1, 2, []byte{1, 2}, ENOSPC},
		{"write oversize", CmdWrite, 0, 0, MaxPayload + 1, make([]byte, MaxPayload+1), EINVAL},
		{"write unknown flag", CmdWrite, 1 << 9, 0, 1, []byte{1}, EINVAL},
		{"write no-hole flag", CmdWrite, CmdFlagNoHole, 0, 1, []byte{1}, EINVAL},
		{"trim past end", CmdTrim, 0, testSize, 1, nil, EINVAL},
		{"zeroes past end", CmdWriteZeroes, 0, testSize - 4096, 8192, nil, ENOSPC},
		{"zeroes fast-zero", CmdWriteZeroes, CmdFlagFastZero, 0, 4096, nil, EINVAL},
		{"cache unsupported", CmdCache, 0, 0, 4096, nil, EINVAL},
		{"block status unsupported", CmdBlockStatus, 0, 0, 4096, nil, EINVAL},
		{"unknown command", 77, 0, 0, 0, nil, EINVAL},
		{"flush", CmdFlush, 0, 0, 0, nil, 0},
		{"flush flags", CmdFlush, CmdFlagFUA, 0, 0, nil, EINVAL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errno, _ := c.do(tc.typ, tc.flags, tc.off, tc.length, tc.payload)
			assert.Equal(t, tc.errno, errno)
			// The connection stays in sync: a following read works.
			assert.Equal(t, data[:4], c.read(5000, 4))
		})
	}
	assert.True(t, logged(hook, logrus.WarnLevel, "beyond the export size"))

	t.Run("trim", func(t *testing.T) {
		_, unmaps0, _, _ := dev.counts()
		errno, _ := c.do(CmdTrim, 0, 4096, 8192, nil)
		require.Zero(t, errno)
		_, unmaps, _, _ := dev.counts()
		assert.Equal(t, unmaps0+1, unmaps)
	})
	t.Run("write zeroes", func(t *testing.T) {
		c.writeAt(pattern(8192, 3), 1<<20)
		_, _, z0, w0 := dev.counts()
		errno, _ := c.do(CmdWriteZeroes, 0, 1<<20, 4096, nil)
		require.Zero(t, errno)
		_, _, z1, _ := dev.counts()
		assert.Equal(t, z0+1, z1, "without NO_HOLE the device's WriteZeroes is used")
		errno, _ = c.do(CmdWriteZeroes, CmdFlagNoHole, 1<<20+4096, 4096, nil)
		require.Zero(t, errno)
		_, _, z2, w2 := dev.counts()
		assert.Equal(t, z1, z2, "NO_HOLE writes zeros instead")
		assert.Greater(t, w2, w0)
		assert.Equal(t, make([]byte, 8192), c.read(1<<20, 8192))
	})
	t.Run("flush and fua", func(t *testing.T) {
		f0, _, _, _ := dev.counts()
		errno, _ := c.do(CmdFlush, 0, 0, 0, nil)
		require.Zero(t, errno)
		errno, _ = c.do(CmdWrite, CmdFlagFUA, 0, 3, []byte{1, 2, 3})
		require.Zero(t, errno)
		errno, _ = c.do(CmdWriteZeroes, CmdFlagFUA, 0, 4096, nil)
		require.Zero(t, errno)
		errno, _ = c.do(CmdWrite, 0, 0, 3, []byte{1, 2, 3})
		require.Zero(t, errno)
		f1, _, _, _ := dev.counts()
		assert.Equal(t, f0+3, f1)
	})
	t.Run("device error", func(t *testing.T) {
		dev.mu.Lock()
		dev.failWrite = syscall.EIO
		dev.mu.Unlock()
		errno, _ := c.do(CmdWrite, 0, 0, 1, []byte{1})
		assert.Equal(t, EIO, errno)
		dev.mu.Lock()
		dev.failWrite = syscall.ENOSPC
		dev.mu.Unlock()
		errno, _ = c.do(CmdWrite, 0, 0, 1, []byte{1})
		assert.Equal(t, ENOSPC, errno)
		dev.mu.Lock()
		dev.failWrite = nil
		dev.mu.Unlock()
		assert.True(t, logged(hook, logrus.ErrorLevel, "request failed on the device"))
	})
	c.disconnect()
}

func TestBadRequestMagicDisconnects(t *testing.T) {
	srv, addr, hook := testServer(t, Options{})
	require.NoError(t, srv.AddExport("disk", blockdev.NewMem(testSize)))
	c := connect(t, addr, "disk")
	c.writeAt([]byte{1}, 0)
	b := AppendRequest(nil, Request{Type: CmdRead, Cookie: 9, Length: 1})
	b[3] ^= 1
	c.write(b)
	c.expectClosed()
	require.Eventually(t, func() bool { return logged(hook, logrus.WarnLevel, "malformed request") }, 5*time.Second, 10*time.Millisecond)
}

func TestDiscCompletesInflight(t *testing.T) {
	mem := blockdev.NewMem(testSize)
	srv, addr, _ := testServer(t, Options{})
	dev := newGateDev(mem)
	t.Cleanup(dev.release)
	require.NoError(t, srv.AddExport("disk", dev))
	c := connect(t, addr, "disk")
	data := pattern(64<<10, 9)
	w := c.send(CmdWrite, 0, 0, uint32(len(data)), data)
	r := c.send(CmdRead, 0, 8192, 4096, nil)
	// Both requests are inside the device, held there, when DISC arrives.
	dev.waitEntered(t, 2)
	c.send(CmdDisc, 0, 0, 0, nil)
	dev.release()
	seen := map[uint64]bool{}
	for range 2 {
		errno, cookie, _, err := c.recv(func(ck uint64) uint32 {
			if ck == r {
				return 4096
			}
			return 0
		})
		require.NoError(t, err)
		require.Zero(t, errno)
		seen[cookie] = true
	}
	assert.Equal(t, map[uint64]bool{w: true, r: true}, seen)
	c.expectClosed()
	got := make([]byte, len(data))
	must(mem.ReadAt(got, 0))
	assert.Equal(t, data, got)
}

// gateDev holds every read and write inside the device until release, and
// counts the requests that entered, so a test knows they are in flight.
type gateDev struct {
	blockdev.Device
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func newGateDev(d blockdev.Device) *gateDev {
	return &gateDev{Device: d, entered: make(chan struct{}, 64), gate: make(chan struct{})}
}

func (d *gateDev) hold() {
	d.entered <- struct{}{}
	<-d.gate
}

func (d *gateDev) ReadAt(p []byte, off int64) (int, error) {
	d.hold()
	return d.Device.ReadAt(p, off)
}

func (d *gateDev) WriteAt(p []byte, off int64) (int, error) {
	d.hold()
	return d.Device.WriteAt(p, off)
}

func (d *gateDev) release() { d.once.Do(func() { close(d.gate) }) }

// waitEntered waits until n requests are inside the device (a minute is
// only a hang guard).
func (d *gateDev) waitEntered(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-d.entered:
		case <-time.After(time.Minute):
			require.FailNow(t, "requests did not reach the device", "%d of %d entered", i, n)
		}
	}
}

// rendezvousDev holds every read until n reads are inside it at once, so a
// server that runs fewer than n requests of a connection at a time never
// gets a read through: after a hang guard the waiting read fails, and every
// read after it.
type rendezvousDev struct {
	blockdev.Device
	n       int
	mu      sync.Mutex
	arrived int
	open    chan struct{}
	broken  chan struct{}
}

func newRendezvousDev(d blockdev.Device, n int) *rendezvousDev {
	return &rendezvousDev{Device: d, n: n, open: make(chan struct{}), broken: make(chan struct{})}
}

func (d *rendezvousDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	d.arrived++
	if d.arrived == d.n {
		close(d.open)
	}
	d.mu.Unlock()
	select {
	case <-d.open:
		return d.Device.ReadAt(p, off)
	case <-d.broken:
	case <-time.After(30 * time.Second):
		d.mu.Lock()
		select {
		case <-d.broken:
		default:
			close(d.broken)
		}
		d.mu.Unlock()
	}
	return 0, errors.New("fewer requests than expected ran at once")
}

// TestPipelined sends many requests before reading any reply: replies may
// come in any order but each matches its request, and requests of one
// connection run concurrently: MaxInflight of them are inside the device
// at once before any completes.
func TestPipelined(t *testing.T) {
	const maxInflight = 16
	mem := blockdev.NewMem(testSize)
	srv, addr, _ := testServer(t, Options{MaxInflight: maxInflight})
	require.NoError(t, srv.AddExport("disk", newRendezvousDev(mem, maxInflight)))
	c := connect(t, addr, "disk")
	const n = 64
	for i := range n {
		must(mem.WriteAt(pattern(4096, byte(i)), int64(i)*4096))
	}
	want := map[uint64]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			want[c.send(CmdRead, 0, uint64(i)*4096, 4096, nil)] = i
		}
	}()
	<-done
	for range n {
		errno, cookie, data, err := c.recv(func(uint64) uint32 { return 4096 })
		require.NoError(t, err)
		require.Zero(t, errno, "a read failed: requests of one connection did not run %d at once", maxInflight)
		i, ok := want[cookie]
		require.True(t, ok, "unexpected or duplicate cookie %d", cookie)
		delete(want, cookie)
		require.Equal(t, pattern(4096, byte(i)), data, "block %d", i)
	}
	c.disconnect()
}

func TestMultiConn(t *testing.T) {
	srv, addr, _ := testServer(t, Options{})
	dev := &countingDev{Device: blockdev.NewMem(testSize)}
	require.NoError(t, srv.AddExport("disk", dev))
	var clients []*client
	for range 4 {
		clients = append(clients, connect(t, addr, "disk"))
	}
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			for j := range 20 {
				off := uint64(i*20+j) * 8192
				errno, _ := c.do(CmdWrite, 0, off, 8192, pattern(8192, byte(i+j)))
				assert.Zero(t, errno)
			}
		})
	}
	wg.Wait()
	// Writes acknowledged on one connection are visible on every other.
	for i := range 4 {
		for j := range 20 {
			off := uint64(i*20+j) * 8192
			assert.Equal(t, pattern(8192, byte(i+j)), clients[(i+1)%4].read(off, 8192))
		}
	}
	f0, _, _, _ := dev.counts()
	errno, _ := clients[3].do(CmdFlush, 0, 0, 0, nil)
	require.Zero(t, errno)
	f1, _, _, _ := dev.counts()
	assert.Equal(t, f0+1, f1)
}

func TestRemoveExportClosesConnections(t *testing.T) {
	srv, addr, _ := testServer(t, Options{})
	require.NoError(t, srv.AddExport("a", blockdev.NewMem(testSize)))
	require.NoError(t, srv.AddExport("b", blockdev.NewMem(testSize)))
	ca := connect(t, addr, "a")
	cb := connect(t, addr, "b")
	ca.writeAt([]byte{1}, 0)
	require.NoError(t, srv.RemoveExport("a"))
	require.Error(t, srv.RemoveExport("a"))
	ca.expectClosed()
	// Other exports are unaffected.
	cb.writeAt([]byte{2}, 0)
	assert.Equal(t, []byte{2}, cb.read(0, 1))
	// A removed export cannot be selected; it can be re-added.
	c := dial(t, addr)
	c.greet(flagCFixedNewstyle)
	_, rep := c.goExport("a")
	assert.Equal(t, RepErrUnknown, rep)
	require.NoError(t, srv.AddExport("a", blockdev.NewMem(4096)))
	info, rep := c.goExport("a")
	require.Zero(t, rep)
	assert.Equal(t, uint64(4096), info.size)
	assert.Equal(t, []string{"a", "b"}, srv.Exports())
}

// readReturnedDev records that a read has returned from the device below.
type readReturnedDev struct {
	blockdev.Device
	returned atomic.Bool
}

func (d *readReturnedDev) ReadAt(p []byte, off int64) (int, error) {
	n, err := d.Device.ReadAt(p, off)
	d.returned.Store(true)
	return n, err
}

// TestCloseWaitsForInflight checks Close closes connections and returns only
// once no request is using the device.
func TestCloseWaitsForInflight(t *testing.T) {
	logger, _ := logtest.NewNullLogger()
	srv := NewServer(Options{Logger: logger})
	dev := &countingDev{Device: blockdev.NewMem(testSize), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	read := &readReturnedDev{Device: dev}
	require.NoError(t, srv.AddExport("disk", read))
	l := must(net.Listen("unix", filepath.Join(t.TempDir(), "nbd.sock")))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	nc := must(net.Dial("unix", l.Addr().String()))
	defer nc.Close()
	c := &rawConn{t: t, nc: nc, br: bufioReader(nc)}
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	_, rep := c.goExport("disk")
	require.Zero(t, rep)
	cl := &client{rawConn: c}
	cl.send(CmdRead, 0, 0, 4096, nil)
	<-dev.entered

	// Whether the device read had returned is recorded the moment Close
	// returns: the order of the two events, not a wait, tells whether Close
	// returned while the request still used the device.
	type closeResult struct {
		err        error
		readReturn bool
	}
	closed := make(chan closeResult, 1)
	go func() {
		err := srv.Close()
		closed <- closeResult{err, read.returned.Load()}
	}()
	c.expectClosed()
	close(dev.gate)
	select {
	case res := <-closed:
		require.NoError(t, res.err)
		assert.True(t, res.readReturn, "Close returned while a request was still using the device")
	case <-time.After(time.Minute):
		t.Fatal("Close did not return")
	}
	require.ErrorIs(t, <-served, ErrServerClosed)
	require.ErrorIs(t, srv.AddExport("x", blockdev.NewMem(1)), ErrServerClosed)
	_, err := net.Dial("unix", l.Addr().String())
	require.Error(t, err, "listener still accepting after Close")
	require.ErrorIs(t, srv.Serve(must(net.Listen("tcp", "127.0.0.1:0"))), ErrServerClosed)
}

func TestServeConnPipe(t *testing.T) {
	logger, _ := logtest.NewNullLogger()
	srv := NewServer(Options{Logger: logger})
	defer srv.Close()
	require.NoError(t, srv.AddExport("disk", blockdev.NewMem(testSize)))
	a, b := net.Pipe()
	go srv.ServeConn(a)
	c := &rawConn{t: t, nc: b, br: bufioReader(b)}
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	_, rep := c.goExport("disk")
	require.Zero(t, rep)
	cl := &client{rawConn: c}
	data := bytes.Repeat([]byte{0x5a}, 100000)
	cl.writeAt(data, 3)
	assert.Equal(t, data, cl.read(3, uint32(len(data))))
	cl.disconnect()
}

func TestErrnoFor(t *testing.T) {
	assert.Equal(t, ENOSPC, errnoFor(blockdev.ErrOutOfRange, true))
	assert.Equal(t, EINVAL, errnoFor(blockdev.ErrOutOfRange, false))
	assert.Equal(t, EPERM, errnoFor(syscall.EROFS, true))
	assert.Equal(t, ENOMEM, errnoFor(syscall.ENOMEM, false))
	assert.Equal(t, EIO, errnoFor(errors.New("replica lost"), false))
}

func TestBufPool(t *testing.T) {
	for _, n := range []int{1, 4095, 4096, 4097, 65536, 1 << 20, MaxPayload - 1, MaxPayload} {
		b := getBuf(n)
		require.Len(t, *b, n)
		c := cap(*b)
		assert.GreaterOrEqual(t, c, n)
		assert.Less(t, c, max(2*n, 8192))
		putBuf(b)
	}
	allocs := testing.AllocsPerRun(100, func() { putBuf(getBuf(128 << 10)) })
	assert.Less(t, allocs, 1.0)
}

func TestExportsSorted(t *testing.T) {
	logger, _ := logtest.NewNullLogger()
	srv := NewServer(Options{Logger: logger})
	for _, n := range []string{"c", "a", "b"} {
		require.NoError(t, srv.AddExport(n, blockdev.NewMem(1)))
	}
	assert.True(t, slices.IsSorted(srv.Exports()))
	require.Error(t, srv.AddExport("n", nil))
	require.Error(t, srv.AddExport(strings.Repeat("x", MaxStringLen+1), blockdev.NewMem(1)))
	require.NoError(t, srv.Close())
}

// shortDev returns short reads and writes without an error, violating
// io.ReaderAt/WriterAt; the server must not send stale buffer bytes.
type shortDev struct{ blockdev.Device }

func (d shortDev) ReadAt(p []byte, off int64) (int, error) {
	n, err := d.Device.ReadAt(p[:len(p)/2], off)
	return n, err
}

func (d shortDev) WriteAt(p []byte, off int64) (int, error) {
	n, err := d.Device.WriteAt(p[:len(p)/2], off)
	return n, err
}

func TestShortDeviceIO(t *testing.T) {
	srv, addr, _ := testServer(t, Options{})
	require.NoError(t, srv.AddExport("disk", shortDev{blockdev.NewMem(testSize)}))
	c := connect(t, addr, "disk")
	errno, data := c.do(CmdRead, 0, 0, 8192, nil)
	assert.Equal(t, EIO, errno)
	assert.Nil(t, data)
	errno, _ = c.do(CmdWrite, 0, 0, 4, []byte{1, 2, 3, 4})
	assert.Equal(t, EIO, errno)
	c.disconnect()
}
