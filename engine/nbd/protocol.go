// Package nbd serves blockdev.Device exports over the Network Block Device
// protocol (fixed newstyle handshake, simple replies), to user-space clients
// such as qemu and libnbd as well as to the kernel nbd client.
//
// This file holds the wire format: constants and pure encode/decode/validate
// functions that do no I/O beyond an io.Reader, so they can be fuzzed.
package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Magic numbers.
const (
	magicInit        = 0x4e42444d41474943 // "NBDMAGIC"
	magicOption      = 0x49484156454f5054 // "IHAVEOPT"
	magicOptionReply = 0x0003e889045565a9
	magicRequest     = 0x25609513
	magicSimpleReply = 0x67446698
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle  = 1 << 0
	flagNoZeroes       = 1 << 1
	flagCFixedNewstyle = 1 << 0
	flagCNoZeroes      = 1 << 1
)

// Transmission flags.
const (
	FlagHasFlags        uint16 = 1 << 0
	FlagReadOnly        uint16 = 1 << 1
	FlagSendFlush       uint16 = 1 << 2
	FlagSendFUA         uint16 = 1 << 3
	FlagRotational      uint16 = 1 << 4
	FlagSendTrim        uint16 = 1 << 5
	FlagSendWriteZeroes uint16 = 1 << 6
	FlagSendDF          uint16 = 1 << 7
	FlagCanMultiConn    uint16 = 1 << 8
)

// Options.
const (
	OptExportName       uint32 = 1
	OptAbort            uint32 = 2
	OptList             uint32 = 3
	OptStartTLS         uint32 = 5
	OptInfo             uint32 = 6
	OptGo               uint32 = 7
	OptStructuredReply  uint32 = 8
	OptListMetaContext  uint32 = 9
	OptSetMetaContext   uint32 = 10
	OptExtendedHeaders  uint32 = 11
	repFlagError        uint32 = 1 << 31
	RepAck              uint32 = 1
	RepServer           uint32 = 2
	RepInfo             uint32 = 3
	RepErrUnsup                = repFlagError | 1
	RepErrPolicy               = repFlagError | 2
	RepErrInvalid              = repFlagError | 3
	RepErrPlatform             = repFlagError | 4
	RepErrTLSReqd              = repFlagError | 5
	RepErrUnknown              = repFlagError | 6
	RepErrShutdown             = repFlagError | 7
	RepErrBlockSizeReqd        = repFlagError | 8
	RepErrTooBig               = repFlagError | 9
	InfoExport          uint16 = 0
	InfoName            uint16 = 1
	InfoDescription     uint16 = 2
	InfoBlockSize       uint16 = 3
)

// Commands and command flags.
const (
	CmdRead        uint16 = 0
	CmdWrite       uint16 = 1
	CmdDisc        uint16 = 2
	CmdFlush       uint16 = 3
	CmdTrim        uint16 = 4
	CmdCache       uint16 = 5
	CmdWriteZeroes uint16 = 6
	CmdBlockStatus uint16 = 7

	CmdFlagFUA      uint16 = 1 << 0
	CmdFlagNoHole   uint16 = 1 << 1
	CmdFlagDF       uint16 = 1 << 2
	CmdFlagReqOne   uint16 = 1 << 3
	CmdFlagFastZero uint16 = 1 << 4
)

// Errors carried in replies (NBD errno values, fixed by the protocol).
const (
	EPERM     uint32 = 1
	EIO       uint32 = 5
	ENOMEM    uint32 = 12
	EINVAL    uint32 = 22
	ENOSPC    uint32 = 28
	EOVERFLOW uint32 = 75
	ENOTSUP   uint32 = 95
	ESHUTDOWN uint32 = 108
)

// Sizes and limits.
const (
	// RequestHeaderSize is the size of a transmission request header.
	RequestHeaderSize = 28
	// SimpleReplyHeaderSize is the size of a simple reply header.
	SimpleReplyHeaderSize = 16
	// OptionHeaderSize is the size of an option request header.
	OptionHeaderSize = 16
	// MinBlockSize, PreferredBlockSize and MaxPayload are the block size
	// constraints advertised with NBD_INFO_BLOCK_SIZE. MaxPayload bounds
	// READ and WRITE lengths; TRIM and WRITE_ZEROES are not bounded by it.
	MinBlockSize       = 1
	PreferredBlockSize = 4096
	MaxPayload         = 32 << 20
	// MaxStringLen is the protocol's limit on strings (export names).
	MaxStringLen = 4096
	// MaxOptionLen bounds the option data the server accepts.
	MaxOptionLen = 64 << 10
)

// Decoding errors.
var (
	ErrShortMessage = errors.New("nbd: message truncated")
	ErrBadMagic     = errors.New("nbd: bad magic")
	ErrMalformed    = errors.New("nbd: malformed option data")
	ErrTooBig       = errors.New("nbd: option data too large")
)

// Request is a transmission-phase request header.
type Request struct {
	Flags  uint16
	Type   uint16
	Cookie uint64
	Offset uint64
	Length uint32
}

// ParseRequest decodes a request header from the first RequestHeaderSize
// bytes of b.
func ParseRequest(b []byte) (Request, error) {
	if len(b) < RequestHeaderSize {
		return Request{}, fmt.Errorf("%w: request header is %d bytes, want %d", ErrShortMessage, len(b), RequestHeaderSize)
	}
	if m := binary.BigEndian.Uint32(b[0:4]); m != magicRequest {
		return Request{}, fmt.Errorf("%w: request magic %#08x, want %#08x", ErrBadMagic, m, magicRequest)
	}
	return Request{
		Flags:  binary.BigEndian.Uint16(b[4:6]),
		Type:   binary.BigEndian.Uint16(b[6:8]),
		Cookie: binary.BigEndian.Uint64(b[8:16]),
		Offset: binary.BigEndian.Uint64(b[16:24]),
		Length: binary.BigEndian.Uint32(b[24:28]),
	}, nil
}

// ReadRequest reads and decodes one request header; buf is scratch space of
// at least RequestHeaderSize bytes. It does not read a WRITE payload.
func ReadRequest(r io.Reader, buf []byte) (Request, error) {
	buf = buf[:RequestHeaderSize]
	if _, err := io.ReadFull(r, buf); err != nil {
		return Request{}, err
	}
	return ParseRequest(buf)
}

// AppendRequest appends the encoding of req to b.
func AppendRequest(b []byte, req Request) []byte {
	b = binary.BigEndian.AppendUint32(b, magicRequest)
	b = binary.BigEndian.AppendUint16(b, req.Flags)
	b = binary.BigEndian.AppendUint16(b, req.Type)
	b = binary.BigEndian.AppendUint64(b, req.Cookie)
	b = binary.BigEndian.AppendUint64(b, req.Offset)
	return binary.BigEndian.AppendUint32(b, req.Length)
}

// putSimpleReply encodes a simple reply header into b[:16].
func putSimpleReply(b []byte, errno uint32, cookie uint64) {
	binary.BigEndian.PutUint32(b[0:4], magicSimpleReply)
	binary.BigEndian.PutUint32(b[4:8], errno)
	binary.BigEndian.PutUint64(b[8:16], cookie)
}

// ParseSimpleReply decodes a simple reply header (used by clients and tests).
func ParseSimpleReply(b []byte) (errno uint32, cookie uint64, err error) {
	if len(b) < SimpleReplyHeaderSize {
		return 0, 0, fmt.Errorf("%w: reply header is %d bytes, want %d", ErrShortMessage, len(b), SimpleReplyHeaderSize)
	}
	if m := binary.BigEndian.Uint32(b[0:4]); m != magicSimpleReply {
		return 0, 0, fmt.Errorf("%w: reply magic %#08x, want %#08x", ErrBadMagic, m, magicSimpleReply)
	}
	return binary.BigEndian.Uint32(b[4:8]), binary.BigEndian.Uint64(b[8:16]), nil
}

// CommandName names a command type for logs.
func CommandName(t uint16) string {
	switch t {
	case CmdRead:
		return "read"
	case CmdWrite:
		return "write"
	case CmdDisc:
		return "disc"
	case CmdFlush:
		return "flush"
	case CmdTrim:
		return "trim"
	case CmdCache:
		return "cache"
	case CmdWriteZeroes:
		return "write_zeroes"
	case CmdBlockStatus:
		return "block_status"
	}
	return fmt.Sprintf("cmd(%d)", t)
}

// allowedFlags lists the command flags the server accepts per command.
func allowedFlags(t uint16) uint16 {
	switch t {
	case CmdWrite, CmdTrim:
		return CmdFlagFUA
	case CmdWriteZeroes:
		return CmdFlagFUA | CmdFlagNoHole
	}
	return 0
}

// CheckRequest validates a request against an export of the given size. It
// returns 0 if the server should execute it, or the NBD errno to reply with
// and the reason. NBD_CMD_DISC is not checked (it always disconnects).
func CheckRequest(req Request, size int64, readOnly bool) (errno uint32, reason string) {
	write := false
	switch req.Type {
	case CmdRead:
	case CmdWrite, CmdTrim, CmdWriteZeroes:
		write = true
	case CmdFlush:
		// Offset and length carry no meaning for flush.
		if req.Flags != 0 {
			return EINVAL, fmt.Sprintf("unsupported flags %#x for flush", req.Flags)
		}
		return 0, ""
	default:
		return EINVAL, fmt.Sprintf("unsupported command %s", CommandName(req.Type))
	}
	if bad := req.Flags &^ allowedFlags(req.Type); bad != 0 {
		return EINVAL, fmt.Sprintf("unsupported flags %#x for %s", bad, CommandName(req.Type))
	}
	if (req.Type == CmdRead || req.Type == CmdWrite) && req.Length > MaxPayload {
		return EINVAL, fmt.Sprintf("%s length %d exceeds the maximum payload %d", CommandName(req.Type), req.Length, MaxPayload)
	}
	if write && readOnly {
		return EPERM, "export is read-only"
	}
	if req.Offset > uint64(size) || uint64(req.Length) > uint64(size)-req.Offset {
		errno = EINVAL
		if req.Type == CmdWrite || req.Type == CmdWriteZeroes {
			errno = ENOSPC
		}
		return errno, fmt.Sprintf("%s offset %d length %d is beyond the export size %d", CommandName(req.Type), req.Offset, req.Length, size)
	}
	return 0, ""
}

// Option is one option request of the handshake.
type Option struct {
	Code uint32
	Data []byte
}

// ParseOptionHeader decodes an option request header (magic, option, length)
// from the first OptionHeaderSize bytes of b.
func ParseOptionHeader(b []byte) (code, length uint32, err error) {
	if len(b) < OptionHeaderSize {
		return 0, 0, fmt.Errorf("%w: option header is %d bytes, want %d", ErrShortMessage, len(b), OptionHeaderSize)
	}
	if m := binary.BigEndian.Uint64(b[0:8]); m != magicOption {
		return 0, 0, fmt.Errorf("%w: option magic %#016x, want %#016x", ErrBadMagic, m, uint64(magicOption))
	}
	return binary.BigEndian.Uint32(b[8:12]), binary.BigEndian.Uint32(b[12:16]), nil
}

// ReadOption reads one option request. Data longer than maxLen is consumed
// from r and discarded and ErrTooBig is returned along with the option code,
// so the caller can reply and stay in sync. Other errors leave the stream
// unusable.
func ReadOption(r io.Reader, maxLen uint32) (Option, error) {
	var hdr [OptionHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Option{}, err
	}
	code, length, err := ParseOptionHeader(hdr[:])
	if err != nil {
		return Option{}, err
	}
	if length > maxLen {
		if _, err := io.CopyN(io.Discard, r, int64(length)); err != nil {
			return Option{Code: code}, fmt.Errorf("discarding %d bytes of option %d data: %w", length, code, err)
		}
		return Option{Code: code}, fmt.Errorf("%w: option %d carries %d bytes, limit %d", ErrTooBig, code, length, maxLen)
	}
	data := make([]byte, length)
	if _, err := io.ReadFull(r, data); err != nil {
		return Option{Code: code}, fmt.Errorf("reading %d bytes of option %d data: %w", length, code, err)
	}
	return Option{Code: code, Data: data}, nil
}

// AppendOption appends the encoding of an option request to b.
func AppendOption(b []byte, code uint32, data []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, magicOption)
	b = binary.BigEndian.AppendUint32(b, code)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// ParseExportName validates the data of NBD_OPT_EXPORT_NAME.
func ParseExportName(data []byte) (string, error) {
	if len(data) > MaxStringLen {
		return "", fmt.Errorf("%w: export name is %d bytes, limit %d", ErrMalformed, len(data), MaxStringLen)
	}
	return string(data), nil
}

// InfoRequest is the data of NBD_OPT_INFO and NBD_OPT_GO.
type InfoRequest struct {
	Name  string
	Infos []uint16
}

// ParseInfoRequest decodes the data of NBD_OPT_INFO / NBD_OPT_GO: a 32-bit
// name length, the name, a 16-bit count and that many 16-bit info types.
func ParseInfoRequest(data []byte) (InfoRequest, error) {
	if len(data) < 4 {
		return InfoRequest{}, fmt.Errorf("%w: %d bytes, too short for the name length", ErrMalformed, len(data))
	}
	nameLen := binary.BigEndian.Uint32(data[0:4])
	if nameLen > MaxStringLen {
		return InfoRequest{}, fmt.Errorf("%w: export name length %d exceeds %d", ErrMalformed, nameLen, MaxStringLen)
	}
	rest := data[4:]
	if uint32(len(rest)) < nameLen+2 {
		return InfoRequest{}, fmt.Errorf("%w: name length %d and info count do not fit in %d bytes", ErrMalformed, nameLen, len(rest))
	}
	req := InfoRequest{Name: string(rest[:nameLen])}
	rest = rest[nameLen:]
	n := int(binary.BigEndian.Uint16(rest[0:2]))
	rest = rest[2:]
	if len(rest) != 2*n {
		return InfoRequest{}, fmt.Errorf("%w: %d info requests need %d bytes, have %d", ErrMalformed, n, 2*n, len(rest))
	}
	if n > 0 {
		req.Infos = make([]uint16, n)
		for i := range req.Infos {
			req.Infos[i] = binary.BigEndian.Uint16(rest[2*i:])
		}
	}
	return req, nil
}

// AppendInfoRequest appends the encoding of an NBD_OPT_INFO/GO payload.
func AppendInfoRequest(b []byte, req InfoRequest) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(req.Name)))
	b = append(b, req.Name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(req.Infos)))
	for _, i := range req.Infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

// appendOptionReply appends an option reply to b.
func appendOptionReply(b []byte, code, typ uint32, data []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, magicOptionReply)
	b = binary.BigEndian.AppendUint32(b, code)
	b = binary.BigEndian.AppendUint32(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// OptionReply is a decoded option reply (used by clients and tests).
type OptionReply struct {
	Code uint32
	Type uint32
	Data []byte
}

// ReadOptionReply reads one option reply, bounding its data to maxLen.
func ReadOptionReply(r io.Reader, maxLen uint32) (OptionReply, error) {
	var hdr [20]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return OptionReply{}, err
	}
	if m := binary.BigEndian.Uint64(hdr[0:8]); m != magicOptionReply {
		return OptionReply{}, fmt.Errorf("%w: option reply magic %#x", ErrBadMagic, m)
	}
	rep := OptionReply{Code: binary.BigEndian.Uint32(hdr[8:12]), Type: binary.BigEndian.Uint32(hdr[12:16])}
	n := binary.BigEndian.Uint32(hdr[16:20])
	if n > maxLen {
		return rep, fmt.Errorf("%w: option reply carries %d bytes", ErrTooBig, n)
	}
	rep.Data = make([]byte, n)
	if _, err := io.ReadFull(r, rep.Data); err != nil {
		return rep, err
	}
	return rep, nil
}

// infoExport encodes an NBD_INFO_EXPORT payload.
func infoExport(size uint64, flags uint16) []byte {
	b := make([]byte, 0, 12)
	b = binary.BigEndian.AppendUint16(b, InfoExport)
	b = binary.BigEndian.AppendUint64(b, size)
	return binary.BigEndian.AppendUint16(b, flags)
}

// infoBlockSize encodes an NBD_INFO_BLOCK_SIZE payload.
func infoBlockSize(minimum, preferred, maximum uint32) []byte {
	b := make([]byte, 0, 14)
	b = binary.BigEndian.AppendUint16(b, InfoBlockSize)
	b = binary.BigEndian.AppendUint32(b, minimum)
	b = binary.BigEndian.AppendUint32(b, preferred)
	return binary.BigEndian.AppendUint32(b, maximum)
}

// infoString encodes NBD_INFO_NAME / NBD_INFO_DESCRIPTION.
func infoString(typ uint16, s string) []byte {
	b := make([]byte, 0, 2+len(s))
	b = binary.BigEndian.AppendUint16(b, typ)
	return append(b, s...)
}

// OptionName names an option code for logs.
func OptionName(code uint32) string {
	switch code {
	case OptExportName:
		return "export_name"
	case OptAbort:
		return "abort"
	case OptList:
		return "list"
	case OptStartTLS:
		return "starttls"
	case OptInfo:
		return "info"
	case OptGo:
		return "go"
	case OptStructuredReply:
		return "structured_reply"
	case OptListMetaContext:
		return "list_meta_context"
	case OptSetMetaContext:
		return "set_meta_context"
	case OptExtendedHeaders:
		return "extended_headers"
	}
	return fmt.Sprintf("opt(%d)", code)
}
