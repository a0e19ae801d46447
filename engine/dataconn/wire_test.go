package dataconn

import (
	"bytes"
	"errors"
	"io"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func encodeRequest(h RequestHeader, payload []byte) []byte {
	return append(AppendRequestHeader(nil, h), payload...)
}

func encodeResponse(h ResponseHeader, payload []byte) []byte {
	return append(AppendResponseHeader(nil, h), payload...)
}

func TestRequestHeaderValidation(t *testing.T) {
	tests := []struct {
		name string
		h    RequestHeader
		ok   bool
	}{
		{"read", RequestHeader{Op: OpRead, Offset: 4096, Length: 4096}, true},
		{"read max", RequestHeader{Op: OpRead, Length: MaxIOSize}, true},
		{"read too long", RequestHeader{Op: OpRead, Length: MaxIOSize + 1}, false},
		{"read with payload", RequestHeader{Op: OpRead, Length: 1, PayloadLen: 1}, false},
		{"write", RequestHeader{Op: OpWrite, Length: 10, PayloadLen: 10}, true},
		{"write length mismatch", RequestHeader{Op: OpWrite, Length: 10, PayloadLen: 9}, false},
		{"write too long", RequestHeader{Op: OpWrite, Length: MaxIOSize + 1, PayloadLen: MaxIOSize + 1}, false},
		{"unmap large range", RequestHeader{Op: OpUnmap, Length: math.MaxUint32}, true},
		{"unmap with payload", RequestHeader{Op: OpUnmap, Length: 1, PayloadLen: 1}, false},
		{"write zeroes", RequestHeader{Op: OpWriteZeroes, Offset: 1, Length: 1}, true},
		{"flush", RequestHeader{Op: OpFlush}, true},
		{"flush with offset", RequestHeader{Op: OpFlush, Offset: 1}, false},
		{"size with length", RequestHeader{Op: OpSize, Length: 1}, false},
		{"ping with payload", RequestHeader{Op: OpPing, PayloadLen: 1}, false},
		{"control", RequestHeader{Op: OpControl, Length: 4, PayloadLen: 10}, true},
		{"control without args", RequestHeader{Op: OpControl, Length: 4, PayloadLen: 4}, true},
		{"control without method", RequestHeader{Op: OpControl, Length: 0, PayloadLen: 4}, false},
		{"control method too long", RequestHeader{Op: OpControl, Length: MaxMethodLen + 1, PayloadLen: 300}, false},
		{"control method beyond payload", RequestHeader{Op: OpControl, Length: 5, PayloadLen: 4}, false},
		{"control payload too large", RequestHeader{Op: OpControl, Length: 4, PayloadLen: MaxPayload + 1}, false},
		{"control max payload", RequestHeader{Op: OpControl, Length: 4, PayloadLen: MaxPayload}, true},
		{"unknown op", RequestHeader{Op: OpControl + 1}, false},
		{"op zero", RequestHeader{}, false},
		{"flags", RequestHeader{Op: OpPing, Flags: 1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.h.Validate()
			if tc.ok {
				require.NoError(t, err)
				got, err := ParseRequestHeader(AppendRequestHeader(nil, tc.h))
				require.NoError(t, err)
				assert.Equal(t, tc.h, got)
			} else {
				require.ErrorIs(t, err, ErrProtocol)
				_, err := ParseRequestHeader(AppendRequestHeader(nil, tc.h))
				require.ErrorIs(t, err, ErrProtocol)
			}
		})
	}
}

func TestFrameDecodeErrors(t *testing.T) {
	good := encodeRequest(RequestHeader{Op: OpWrite, Seq: 7, Offset: 512, Length: 3, PayloadLen: 3}, []byte("abc"))
	h, p, n, err := DecodeRequest(append(good, "next frame"...))
	require.NoError(t, err)
	assert.Equal(t, RequestHeader{Op: OpWrite, Seq: 7, Offset: 512, Length: 3, PayloadLen: 3}, h)
	assert.Equal(t, []byte("abc"), p)
	assert.Equal(t, len(good), n)

	badMagic := bytes.Clone(good)
	badMagic[0] ^= 0xff
	badVersion := bytes.Clone(good)
	badVersion[4] = Version + 1
	for name, b := range map[string][]byte{"empty": nil, "short header": good[:RequestHeaderSize-1], "bad magic": badMagic, "bad version": badVersion} {
		_, _, _, err := DecodeRequest(b)
		assert.ErrorIs(t, err, ErrProtocol, name)
	}
	_, _, _, err = DecodeRequest(good[:len(good)-1])
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)

	// Streams: a clean end is io.EOF, a cut frame is not.
	_, _, err = ReadRequest(bytes.NewReader(nil), nil)
	assert.Equal(t, io.EOF, err)
	_, _, err = ReadRequest(bytes.NewReader(good[:10]), nil)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, _, err = ReadRequest(bytes.NewReader(good[:len(good)-1]), nil)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)

	// A huge declared payload is rejected before anything is allocated.
	huge := encodeRequest(RequestHeader{Op: OpControl, Length: 4, PayloadLen: math.MaxUint32}, nil)
	_, _, err = ReadRequest(bytes.NewReader(huge), func(n int) []byte {
		t.Fatalf("allocated %d bytes for an invalid frame", n)
		return nil
	})
	assert.ErrorIs(t, err, ErrProtocol)

	resp := encodeResponse(ResponseHeader{Status: StatusNotFound, Seq: 3, PayloadLen: 4}, []byte("gone"))
	rh, rp, rn, err := DecodeResponse(resp)
	require.NoError(t, err)
	assert.Equal(t, ResponseHeader{Status: StatusNotFound, Seq: 3, PayloadLen: 4}, rh)
	assert.Equal(t, []byte("gone"), rp)
	assert.Equal(t, len(resp), rn)
	_, _, _, err = DecodeResponse(encodeResponse(ResponseHeader{Status: StatusError, PayloadLen: MaxErrorLen + 1}, nil))
	assert.ErrorIs(t, err, ErrProtocol)
	_, _, _, err = DecodeResponse(encodeResponse(ResponseHeader{PayloadLen: MaxPayload + 1}, nil))
	assert.ErrorIs(t, err, ErrProtocol)
}

func TestRemoteErrorMatching(t *testing.T) {
	for _, s := range statusSentinels {
		err := error(&RemoteError{Op: OpControl, Status: s.status, Message: "m"})
		assert.ErrorIs(t, err, s.err)
		assert.ErrorIs(t, err, ErrRemote)
		assert.Equal(t, s.status, statusOf(err), "a proxied error keeps its code")
	}
	err := error(&RemoteError{Op: OpRead, Status: 999, Message: "from the future"})
	assert.ErrorIs(t, err, ErrRemote)
	assert.Equal(t, StatusError, statusOf(errors.New("plain")))
}

// fuzzAlloc fails the fuzz run if a decoder asks for more than the limit.
func fuzzAlloc(t *testing.T, got *int) func(int) []byte {
	return func(n int) []byte {
		if n < 0 || n > MaxPayload {
			t.Fatalf("decoder asked for %d bytes", n)
		}
		*got = n
		return make([]byte, n)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add(encodeRequest(RequestHeader{Op: OpRead, Seq: 1, Offset: 4096, Length: 4096}, nil))
	f.Add(encodeRequest(RequestHeader{Op: OpWrite, Seq: 2, Offset: 1000, Length: 5, PayloadLen: 5}, []byte("hello")))
	f.Add(encodeRequest(RequestHeader{Op: OpUnmap, Seq: 3, Length: 1 << 30}, nil))
	f.Add(encodeRequest(RequestHeader{Op: OpWriteZeroes, Seq: 4, Offset: -1, Length: 7}, nil))
	f.Add(encodeRequest(RequestHeader{Op: OpFlush, Seq: 5}, nil))
	f.Add(encodeRequest(RequestHeader{Op: OpSize, Seq: 6}, nil))
	f.Add(encodeRequest(RequestHeader{Op: OpPing, Seq: 7}, nil))
	f.Add(encodeRequest(RequestHeader{Op: OpControl, Seq: 8, Length: 8, PayloadLen: 22}, []byte(`snapshot{"name":"s1"}`+"x")))
	f.Add(encodeRequest(RequestHeader{Op: OpControl, Seq: 9, Length: 4, PayloadLen: math.MaxUint32}, nil))
	f.Add(encodeRequest(RequestHeader{Op: OpWrite, Seq: 10, Length: MaxIOSize + 1, PayloadLen: MaxIOSize + 1}, nil))
	f.Add([]byte("STRQ"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, payload, n, err := DecodeRequest(data)
		var allocated int
		sh, sp, serr := ReadRequest(bytes.NewReader(data), fuzzAlloc(t, &allocated))
		if err != nil {
			if serr == nil {
				t.Fatalf("stream decoder accepted what the slice decoder rejected (%v)", err)
			}
			return
		}
		if serr != nil {
			t.Fatalf("stream decoder rejected a valid frame: %v", serr)
		}
		if h.Validate() != nil || len(payload) != int(h.PayloadLen) || len(payload) > MaxPayload || n > len(data) {
			t.Fatalf("inconsistent decode: %+v payload %d n %d", h, len(payload), n)
		}
		if h != sh || !bytes.Equal(payload, sp) || allocated != len(payload) {
			t.Fatalf("decoders disagree: %+v vs %+v", h, sh)
		}
		if !bytes.Equal(encodeRequest(h, payload), data[:n]) {
			t.Fatal("re-encoding does not reproduce the frame")
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(encodeResponse(ResponseHeader{Seq: 1, PayloadLen: 4}, []byte("data")))
	f.Add(encodeResponse(ResponseHeader{Seq: 2}, nil))
	f.Add(encodeResponse(ResponseHeader{Seq: 3, PayloadLen: 8}, make([]byte, 8)))
	f.Add(encodeResponse(ResponseHeader{Seq: 4, Status: StatusOutOfRange, PayloadLen: 5}, []byte("range")))
	f.Add(encodeResponse(ResponseHeader{Seq: 5, Status: StatusError, PayloadLen: MaxErrorLen + 1}, nil))
	f.Add(encodeResponse(ResponseHeader{Seq: 6, PayloadLen: math.MaxUint32}, nil))
	f.Add(encodeResponse(ResponseHeader{Seq: 7, Status: 12345}, nil))
	f.Add([]byte("STRP\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, payload, n, err := DecodeResponse(data)
		var allocated int
		sh, sp, serr := ReadResponse(bytes.NewReader(data), fuzzAlloc(t, &allocated))
		if err != nil {
			if serr == nil {
				t.Fatalf("stream decoder accepted what the slice decoder rejected (%v)", err)
			}
			return
		}
		if serr != nil {
			t.Fatalf("stream decoder rejected a valid frame: %v", serr)
		}
		limit := MaxPayload
		if h.Status != StatusOK {
			limit = MaxErrorLen
		}
		if len(payload) != int(h.PayloadLen) || len(payload) > limit || n > len(data) {
			t.Fatalf("inconsistent decode: %+v payload %d n %d", h, len(payload), n)
		}
		if h != sh || !bytes.Equal(payload, sp) || allocated != len(payload) {
			t.Fatalf("decoders disagree: %+v vs %+v", h, sh)
		}
		if !bytes.Equal(encodeResponse(h, payload), data[:n]) {
			t.Fatal("re-encoding does not reproduce the frame")
		}
	})
}
