package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// FuzzRequest: the request decoder never panics, rejects anything without
// the request magic, and re-encodes what it accepts byte for byte; the
// validator never panics and never accepts a request beyond the export.
func FuzzRequest(f *testing.F) {
	for _, r := range []Request{
		{Type: CmdRead, Length: 4096},
		{Type: CmdWrite, Flags: CmdFlagFUA, Cookie: 1, Offset: 512, Length: 1},
		{Type: CmdWriteZeroes, Flags: CmdFlagNoHole, Offset: 1 << 20, Length: 1 << 30},
		{Type: CmdTrim, Offset: 1<<64 - 1, Length: 1<<32 - 1},
		{Type: CmdDisc},
		{Type: 99, Flags: 0xffff},
	} {
		f.Add(AppendRequest(nil, r), int64(1<<20), false)
	}
	f.Add([]byte{}, int64(0), true)
	f.Add(bytes.Repeat([]byte{0x25}, 40), int64(-1), true)
	f.Fuzz(func(t *testing.T, data []byte, size int64, readOnly bool) {
		req, err := ParseRequest(data)
		if err != nil {
			if len(data) >= RequestHeaderSize && binary.BigEndian.Uint32(data) == magicRequest {
				t.Fatalf("valid header rejected: %v", err)
			}
			if !errors.Is(err, ErrBadMagic) && !errors.Is(err, ErrShortMessage) {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		if len(data) < RequestHeaderSize || binary.BigEndian.Uint32(data) != magicRequest {
			t.Fatalf("garbage accepted: %x", data)
		}
		if enc := AppendRequest(nil, req); !bytes.Equal(enc, data[:RequestHeaderSize]) {
			t.Fatalf("round trip: %x != %x", enc, data[:RequestHeaderSize])
		}
		// ReadRequest agrees with ParseRequest.
		req2, err := ReadRequest(bytes.NewReader(data), make([]byte, RequestHeaderSize))
		if err != nil || req2 != req {
			t.Fatalf("ReadRequest = %+v, %v; want %+v", req2, err, req)
		}
		if size < 0 {
			size = -size
			if size < 0 {
				size = 0
			}
		}
		errno, reason := CheckRequest(req, size, readOnly)
		if (errno == 0) == (reason != "") {
			t.Fatalf("errno %d with reason %q", errno, reason)
		}
		if errno != 0 {
			return
		}
		switch req.Type {
		case CmdFlush:
		case CmdRead, CmdWrite, CmdTrim, CmdWriteZeroes:
			if end := req.Offset + uint64(req.Length); end < req.Offset || end > uint64(size) {
				t.Fatalf("accepted out-of-range %+v for size %d", req, size)
			}
			if req.Type != CmdRead && readOnly {
				t.Fatalf("accepted a write to a read-only export: %+v", req)
			}
			if (req.Type == CmdRead || req.Type == CmdWrite) && req.Length > MaxPayload {
				t.Fatalf("accepted an oversize payload: %+v", req)
			}
			if req.Flags&^allowedFlags(req.Type) != 0 {
				t.Fatalf("accepted unsupported flags: %+v", req)
			}
		default:
			t.Fatalf("accepted unknown command %+v", req)
		}
	})
}

// FuzzOption: the option reader and the option payload parsers never panic,
// reject garbage with an error, and round-trip what they accept.
func FuzzOption(f *testing.F) {
	f.Add(AppendOption(nil, OptGo, AppendInfoRequest(nil, InfoRequest{Name: "disk", Infos: []uint16{InfoBlockSize}})))
	f.Add(AppendOption(nil, OptInfo, AppendInfoRequest(nil, InfoRequest{})))
	f.Add(AppendOption(nil, OptExportName, []byte("vol")))
	f.Add(AppendOption(nil, OptList, nil))
	f.Add(AppendOption(AppendOption(nil, OptAbort, nil), OptGo, []byte{0, 0, 0, 9}))
	f.Add(AppendOption(nil, OptGo, []byte{0xff, 0xff, 0xff, 0xff}))
	f.Add([]byte("IHAVEOPT\x00\x00\x00\x07\xff\xff\xff\xff"))
	f.Add([]byte("NBDMAGIC"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for i := 0; ; i++ {
			before := r.Len()
			opt, err := ReadOption(r, 1024)
			if err != nil {
				switch {
				case errors.Is(err, ErrTooBig):
					continue // the stream stays in sync
				case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, ErrBadMagic):
					return
				default:
					t.Fatalf("unexpected error: %v", err)
				}
			}
			if consumed := before - r.Len(); consumed != OptionHeaderSize+len(opt.Data) {
				t.Fatalf("consumed %d bytes for %d bytes of data", consumed, len(opt.Data))
			}
			if enc := AppendOption(nil, opt.Code, opt.Data); !bytes.Equal(enc, data[len(data)-before:len(data)-r.Len()]) {
				t.Fatalf("option round trip mismatch")
			}
			switch opt.Code {
			case OptExportName:
				name, err := ParseExportName(opt.Data)
				if err == nil && name != string(opt.Data) {
					t.Fatalf("export name %q != %q", name, opt.Data)
				}
				if err == nil && len(name) > MaxStringLen {
					t.Fatalf("accepted a %d-byte name", len(name))
				}
			default:
				req, err := ParseInfoRequest(opt.Data)
				if err != nil {
					if !errors.Is(err, ErrMalformed) {
						t.Fatalf("unexpected error type: %v", err)
					}
					continue
				}
				if len(req.Name) > MaxStringLen {
					t.Fatalf("accepted a %d-byte name", len(req.Name))
				}
				if enc := AppendInfoRequest(nil, req); !bytes.Equal(enc, opt.Data) {
					t.Fatalf("info request round trip: %x != %x", enc, opt.Data)
				}
			}
		}
	})
}

// FuzzSession feeds arbitrary client bytes to a live server connection (after
// a valid GO in most seeds): the server never panics and always ends the
// connection once the client hangs up.
func FuzzSession(f *testing.F) {
	for _, s := range sessionSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzSession(t, data)
	})
}
