// Package dataconn is the engine↔replica data connection: a compact,
// pipelined binary protocol over one TCP connection. Block I/O and a few
// ordered control calls (snapshot, chain, extents, ...) share the same
// stream, so a control call lands at one exact point among the writes.
//
// Wire format, all integers big-endian.
//
// Request header (32 bytes), then PayloadLen bytes of payload:
//
//	off size field       meaning
//	  0    4 magic       0x53545251 ("STRQ")
//	  4    1 version     1
//	  5    1 op          READ=1 WRITE=2 UNMAP=3 WRITE_ZEROES=4 FLUSH=5 SIZE=6 PING=7 CONTROL=8
//	  6    2 flags       reserved, must be 0
//	  8    8 seq         chosen by the client, echoed in the response
//	 16    8 offset      byte offset (data ops), 0 otherwise
//	 24    4 length      byte count (data ops); method-name length (CONTROL)
//	 28    4 payloadLen  WRITE: = length; CONTROL: method name + JSON args; else 0
//
// Response header (20 bytes), then PayloadLen bytes of payload:
//
//	off size field       meaning
//	  0    4 magic       0x53545250 ("STRP")
//	  4    4 status      0 ok, otherwise an error code (see Status)
//	  8    8 seq         the request's seq
//	 16    4 payloadLen  ok: READ data, SIZE int64, CONTROL JSON; error: message
package dataconn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	RequestMagic  uint32 = 0x53545251 // "STRQ"
	ResponseMagic uint32 = 0x53545250 // "STRP"
	Version       uint8  = 1

	RequestHeaderSize  = 32
	ResponseHeaderSize = 20

	// MaxIOSize is the largest READ or WRITE one frame carries; the client
	// splits bigger I/O.
	MaxIOSize = 32 << 20
	// MaxPayload bounds every payload: the largest WRITE plus slack for
	// CONTROL arguments and replies. Nothing is allocated for a frame that
	// declares more.
	MaxPayload = MaxIOSize + 64<<10
	// MaxMethodLen bounds a CONTROL method name.
	MaxMethodLen = 255
	// MaxErrorLen bounds an error message in a failed response.
	MaxErrorLen = 4096
)

// Op is a request's operation.
type Op uint8

const (
	OpRead Op = iota + 1
	OpWrite
	OpUnmap
	OpWriteZeroes
	OpFlush
	OpSize
	OpPing
	OpControl
)

var opNames = [...]string{"", "READ", "WRITE", "UNMAP", "WRITE_ZEROES", "FLUSH", "SIZE", "PING", "CONTROL"}

func (o Op) String() string {
	if o >= OpRead && o <= OpControl {
		return opNames[o]
	}
	return fmt.Sprintf("OP(%d)", uint8(o))
}

// ErrProtocol marks a malformed frame. The stream cannot be trusted after
// one, so both sides close the connection.
var ErrProtocol = errors.New("dataconn: protocol error")

func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, args...))
}

// RequestHeader is a decoded request header; magic and version are implied.
type RequestHeader struct {
	Op         Op
	Flags      uint16
	Seq        uint64
	Offset     int64
	Length     uint32
	PayloadLen uint32
}

// ResponseHeader is a decoded response header; magic is implied.
type ResponseHeader struct {
	Status     Status
	Seq        uint64
	PayloadLen uint32
}

// Validate checks that the fields agree with each other and the limits.
func (h RequestHeader) Validate() error {
	if h.Flags != 0 {
		return protoErr("unknown flags %#x", h.Flags)
	}
	if h.PayloadLen > MaxPayload {
		return protoErr("%s payload of %d bytes exceeds %d", h.Op, h.PayloadLen, MaxPayload)
	}
	switch h.Op {
	case OpRead:
		if h.Length > MaxIOSize || h.PayloadLen != 0 {
			return protoErr("READ length %d payload %d", h.Length, h.PayloadLen)
		}
	case OpWrite:
		if h.Length > MaxIOSize || h.PayloadLen != h.Length {
			return protoErr("WRITE length %d payload %d", h.Length, h.PayloadLen)
		}
	case OpUnmap, OpWriteZeroes:
		if h.PayloadLen != 0 {
			return protoErr("%s with a payload of %d bytes", h.Op, h.PayloadLen)
		}
	case OpFlush, OpSize, OpPing:
		if h.Offset != 0 || h.Length != 0 || h.PayloadLen != 0 {
			return protoErr("%s with offset %d length %d payload %d", h.Op, h.Offset, h.Length, h.PayloadLen)
		}
	case OpControl:
		if h.Offset != 0 || h.Length == 0 || h.Length > MaxMethodLen || h.PayloadLen < h.Length {
			return protoErr("CONTROL with offset %d method length %d payload %d", h.Offset, h.Length, h.PayloadLen)
		}
	default:
		return protoErr("unknown op %d", uint8(h.Op))
	}
	return nil
}

// Validate checks the payload length against what the status allows.
func (h ResponseHeader) Validate() error {
	if h.Status == StatusOK && h.PayloadLen > MaxPayload {
		return protoErr("response payload of %d bytes exceeds %d", h.PayloadLen, MaxPayload)
	}
	if h.Status != StatusOK && h.PayloadLen > MaxErrorLen {
		return protoErr("error message of %d bytes exceeds %d", h.PayloadLen, MaxErrorLen)
	}
	return nil
}

var be = binary.BigEndian

// AppendRequestHeader appends the encoded header to dst.
func AppendRequestHeader(dst []byte, h RequestHeader) []byte {
	dst = be.AppendUint32(dst, RequestMagic)
	dst = append(dst, Version, byte(h.Op))
	dst = be.AppendUint16(dst, h.Flags)
	dst = be.AppendUint64(dst, h.Seq)
	dst = be.AppendUint64(dst, uint64(h.Offset))
	dst = be.AppendUint32(dst, h.Length)
	return be.AppendUint32(dst, h.PayloadLen)
}

// AppendResponseHeader appends the encoded header to dst.
func AppendResponseHeader(dst []byte, h ResponseHeader) []byte {
	dst = be.AppendUint32(dst, ResponseMagic)
	dst = be.AppendUint32(dst, uint32(h.Status))
	dst = be.AppendUint64(dst, h.Seq)
	return be.AppendUint32(dst, h.PayloadLen)
}

// ParseRequestHeader decodes and validates the first RequestHeaderSize bytes of b.
func ParseRequestHeader(b []byte) (RequestHeader, error) {
	if len(b) < RequestHeaderSize {
		return RequestHeader{}, protoErr("request header of %d bytes", len(b))
	}
	if m := be.Uint32(b); m != RequestMagic {
		return RequestHeader{}, protoErr("bad request magic %#08x", m)
	}
	if v := b[4]; v != Version {
		return RequestHeader{}, protoErr("unsupported version %d", v)
	}
	h := RequestHeader{
		Op:         Op(b[5]),
		Flags:      be.Uint16(b[6:]),
		Seq:        be.Uint64(b[8:]),
		Offset:     int64(be.Uint64(b[16:])),
		Length:     be.Uint32(b[24:]),
		PayloadLen: be.Uint32(b[28:]),
	}
	return h, h.Validate()
}

// ParseResponseHeader decodes and validates the first ResponseHeaderSize bytes of b.
func ParseResponseHeader(b []byte) (ResponseHeader, error) {
	if len(b) < ResponseHeaderSize {
		return ResponseHeader{}, protoErr("response header of %d bytes", len(b))
	}
	if m := be.Uint32(b); m != ResponseMagic {
		return ResponseHeader{}, protoErr("bad response magic %#08x", m)
	}
	h := ResponseHeader{
		Status:     Status(be.Uint32(b[4:])),
		Seq:        be.Uint64(b[8:]),
		PayloadLen: be.Uint32(b[16:]),
	}
	return h, h.Validate()
}

// DecodeRequest decodes one request frame from the front of b. The payload
// aliases b; n is the frame's size.
func DecodeRequest(b []byte) (h RequestHeader, payload []byte, n int, err error) {
	if h, err = ParseRequestHeader(b); err != nil {
		return RequestHeader{}, nil, 0, err
	}
	end := RequestHeaderSize + int(h.PayloadLen)
	if len(b) < end {
		return RequestHeader{}, nil, 0, fmt.Errorf("request payload: %w", io.ErrUnexpectedEOF)
	}
	return h, b[RequestHeaderSize:end:end], end, nil
}

// DecodeResponse decodes one response frame from the front of b. The
// payload aliases b; n is the frame's size.
func DecodeResponse(b []byte) (h ResponseHeader, payload []byte, n int, err error) {
	if h, err = ParseResponseHeader(b); err != nil {
		return ResponseHeader{}, nil, 0, err
	}
	end := ResponseHeaderSize + int(h.PayloadLen)
	if len(b) < end {
		return ResponseHeader{}, nil, 0, fmt.Errorf("response payload: %w", io.ErrUnexpectedEOF)
	}
	return h, b[ResponseHeaderSize:end:end], end, nil
}

// ReadRequestHeader reads and validates one request header, using buf
// (at least RequestHeaderSize bytes) as scratch. A clean end of stream
// before the first byte is io.EOF.
func ReadRequestHeader(r io.Reader, buf []byte) (RequestHeader, error) {
	buf = buf[:RequestHeaderSize]
	if _, err := io.ReadFull(r, buf); err != nil {
		return RequestHeader{}, err
	}
	return ParseRequestHeader(buf)
}

// ReadResponseHeader is ReadRequestHeader for responses.
func ReadResponseHeader(r io.Reader, buf []byte) (ResponseHeader, error) {
	buf = buf[:ResponseHeaderSize]
	if _, err := io.ReadFull(r, buf); err != nil {
		return ResponseHeader{}, err
	}
	return ParseResponseHeader(buf)
}

// ReadRequest reads one whole request frame. alloc (nil: make) supplies the
// payload buffer; it is only called with a validated length.
func ReadRequest(r io.Reader, alloc func(n int) []byte) (RequestHeader, []byte, error) {
	var buf [RequestHeaderSize]byte
	h, err := ReadRequestHeader(r, buf[:])
	if err != nil {
		return RequestHeader{}, nil, err
	}
	p, err := readPayload(r, int(h.PayloadLen), alloc)
	if err != nil {
		return RequestHeader{}, nil, fmt.Errorf("request payload: %w", err)
	}
	return h, p, nil
}

// ReadResponse reads one whole response frame; see ReadRequest.
func ReadResponse(r io.Reader, alloc func(n int) []byte) (ResponseHeader, []byte, error) {
	var buf [ResponseHeaderSize]byte
	h, err := ReadResponseHeader(r, buf[:])
	if err != nil {
		return ResponseHeader{}, nil, err
	}
	p, err := readPayload(r, int(h.PayloadLen), alloc)
	if err != nil {
		return ResponseHeader{}, nil, fmt.Errorf("response payload: %w", err)
	}
	return h, p, nil
}

func readPayload(r io.Reader, n int, alloc func(int) []byte) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	var p []byte
	if alloc != nil {
		p = alloc(n)
	} else {
		p = make([]byte, n)
	}
	if len(p) != n {
		return nil, fmt.Errorf("allocator returned %d bytes, want %d", len(p), n)
	}
	if _, err := io.ReadFull(r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return p, nil
}
