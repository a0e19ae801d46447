package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

func TestRequestRoundTrip(t *testing.T) {
	req := Request{Flags: CmdFlagFUA, Type: CmdWrite, Cookie: 0x0102030405060708, Offset: 1 << 40, Length: 4096}
	b := AppendRequest(nil, req)
	require.Len(t, b, RequestHeaderSize)
	assert.Equal(t, []byte{0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1}, b[:8], "magic, flags, type on the wire")
	got, err := ParseRequest(b)
	require.NoError(t, err)
	assert.Equal(t, req, got)

	_, err = ParseRequest(b[:27])
	assert.ErrorIs(t, err, ErrShortMessage)
	b[0] = 0
	_, err = ParseRequest(b)
	assert.ErrorIs(t, err, ErrBadMagic)
	_, err = ReadRequest(bytes.NewReader(b[:10]), make([]byte, RequestHeaderSize))
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

func TestSimpleReply(t *testing.T) {
	var b [SimpleReplyHeaderSize]byte
	putSimpleReply(b[:], EINVAL, 77)
	errno, cookie, err := ParseSimpleReply(b[:])
	require.NoError(t, err)
	assert.Equal(t, EINVAL, errno)
	assert.Equal(t, uint64(77), cookie)
	b[1] = 0
	_, _, err = ParseSimpleReply(b[:])
	assert.ErrorIs(t, err, ErrBadMagic)
}

func TestCheckRequest(t *testing.T) {
	const size = 64 << 20
	tests := []struct {
		req      Request
		readOnly bool
		errno    uint32
	}{
		{Request{Type: CmdRead, Offset: size - MaxPayload, Length: MaxPayload}, false, 0},
		{Request{Type: CmdRead, Offset: size - MaxPayload + 1, Length: MaxPayload}, false, EINVAL},
		{Request{Type: CmdRead, Offset: size, Length: 0}, false, 0},
		{Request{Type: CmdRead, Offset: 1<<64 - 1, Length: 1}, false, EINVAL},
		{Request{Type: CmdWrite, Offset: size - 1, Length: 2}, false, ENOSPC},
		{Request{Type: CmdWriteZeroes, Offset: size, Length: 1}, false, ENOSPC},
		{Request{Type: CmdTrim, Offset: size, Length: 1}, false, EINVAL},
		{Request{Type: CmdWrite, Length: 1}, true, EPERM},
		{Request{Type: CmdTrim, Length: 1}, true, EPERM},
		{Request{Type: CmdWriteZeroes, Length: 1}, true, EPERM},
		{Request{Type: CmdRead, Length: 1}, true, 0},
		{Request{Type: CmdFlush}, true, 0},
		{Request{Type: CmdFlush, Offset: 5, Length: 7}, false, 0},
		{Request{Type: CmdRead, Length: MaxPayload}, false, 0},
		{Request{Type: CmdRead, Length: MaxPayload + 1}, false, EINVAL},
		{Request{Type: CmdWrite, Length: MaxPayload + 1}, false, EINVAL},
		{Request{Type: CmdWriteZeroes, Flags: CmdFlagNoHole | CmdFlagFUA, Length: size}, false, 0},
		{Request{Type: CmdTrim, Flags: CmdFlagNoHole, Length: 1}, false, EINVAL},
		{Request{Type: CmdRead, Flags: CmdFlagFUA, Length: 1}, false, EINVAL},
		{Request{Type: CmdCache, Length: 1}, false, EINVAL},
		{Request{Type: 0xffff}, false, EINVAL},
	}
	for _, tc := range tests {
		errno, reason := CheckRequest(tc.req, size, tc.readOnly)
		assert.Equal(t, tc.errno, errno, "%+v readOnly=%v: %s", tc.req, tc.readOnly, reason)
		assert.Equal(t, errno != 0, reason != "")
	}
	// Large trims and zeroes are not bounded by the payload limit.
	errno, _ := CheckRequest(Request{Type: CmdTrim, Length: 1<<32 - 1}, 1<<33, false)
	assert.Zero(t, errno)
}

func TestParseInfoRequest(t *testing.T) {
	req := InfoRequest{Name: "vol-1", Infos: []uint16{InfoBlockSize, InfoName}}
	b := AppendInfoRequest(nil, req)
	got, err := ParseInfoRequest(b)
	require.NoError(t, err)
	assert.Equal(t, req, got)

	got, err = ParseInfoRequest(AppendInfoRequest(nil, InfoRequest{}))
	require.NoError(t, err)
	assert.Equal(t, InfoRequest{}, got)

	for _, bad := range [][]byte{
		nil, {0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 1},
		{0, 0, 0, 0, 0, 0, 0}, // trailing byte
		append(binary.BigEndian.AppendUint32(nil, MaxStringLen+1), make([]byte, MaxStringLen+3)...),
	} {
		_, err := ParseInfoRequest(bad)
		assert.ErrorIs(t, err, ErrMalformed, "%x", bad)
	}
}

func TestReadOption(t *testing.T) {
	stream := AppendOption(nil, OptGo, []byte("abc"))
	stream = AppendOption(stream, OptList, make([]byte, 100))
	stream = AppendOption(stream, OptAbort, nil)
	r := bytes.NewReader(stream)
	o, err := ReadOption(r, 10)
	require.NoError(t, err)
	assert.Equal(t, Option{Code: OptGo, Data: []byte("abc")}, o)
	o, err = ReadOption(r, 10)
	require.ErrorIs(t, err, ErrTooBig)
	assert.Equal(t, OptList, o.Code)
	o, err = ReadOption(r, 10)
	require.NoError(t, err, "stream stays in sync after an oversized option")
	assert.Equal(t, OptAbort, o.Code)
	_, err = ReadOption(r, 10)
	assert.ErrorIs(t, err, io.EOF)

	bad := AppendOption(nil, OptGo, nil)
	bad[7] ^= 1
	_, err = ReadOption(bytes.NewReader(bad), 10)
	assert.ErrorIs(t, err, ErrBadMagic)
	_, err = ReadOption(bytes.NewReader(AppendOption(nil, OptGo, []byte("abc"))[:18]), 10)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// fuzzSession feeds raw client bytes to a server connection: after a valid
// greeting exchange when handshake is set, else from the first byte.
func fuzzSession(t *testing.T, input []byte) {
	logger, _ := logtest.NewNullLogger()
	srv := NewServer(Options{Logger: logger, HandshakeTimeout: 2 * time.Second, MaxInflight: 4})
	defer srv.Close()
	if err := srv.AddExport("disk", blockdev.NewMem(64<<10)); err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeConn(a)
	}()
	go func() { _, _ = io.Copy(io.Discard, b) }()
	_, _ = b.Write(input)
	b.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("server connection did not end after the client closed")
	}
}

func TestSessionGarbage(t *testing.T) {
	for _, in := range sessionSeeds() {
		fuzzSession(t, in)
	}
}

func sessionSeeds() [][]byte {
	flags := binary.BigEndian.AppendUint32(nil, flagCFixedNewstyle|flagCNoZeroes)
	goDisk := AppendOption(nil, OptGo, AppendInfoRequest(nil, InfoRequest{Name: "disk"}))
	start := append(append([]byte{}, flags...), goDisk...)
	req := func(typ, fl uint16, off uint64, n uint32, payload []byte) []byte {
		return append(AppendRequest(nil, Request{Type: typ, Flags: fl, Offset: off, Length: n, Cookie: 1}), payload...)
	}
	var seeds [][]byte
	seeds = append(seeds,
		nil,
		flags,
		append(append([]byte{}, flags...), AppendOption(nil, OptExportName, []byte("disk"))...),
		append(append([]byte{}, flags...), AppendOption(nil, OptList, nil)...),
		append(append([]byte{}, start...), req(CmdWrite, 0, 0, 4, []byte{1, 2, 3, 4})...),
		append(append([]byte{}, start...), req(CmdRead, 0, 0, 4096, nil)...),
		append(append([]byte{}, start...), req(CmdWrite, 0, 1<<20, 4, []byte{1, 2, 3, 4})...),
		append(append([]byte{}, start...), req(CmdWriteZeroes, CmdFlagNoHole, 0, 8192, nil)...),
		append(append([]byte{}, start...), req(CmdTrim, CmdFlagFUA, 0, 8192, nil)...),
		append(append([]byte{}, start...), req(CmdDisc, 0, 0, 0, nil)...),
		append(append([]byte{}, start...), []byte("garbage garbage garbage garbage")...),
	)
	return seeds
}

func TestFuzzHelpersReject(t *testing.T) {
	// Sanity: garbage is an error, not a panic.
	_, err := ParseRequest(bytes.Repeat([]byte{0xff}, 28))
	assert.True(t, errors.Is(err, ErrBadMagic))
	_, _, err = ParseOptionHeader(bytes.Repeat([]byte{0xff}, 16))
	assert.True(t, errors.Is(err, ErrBadMagic))
}
