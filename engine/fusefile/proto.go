package fusefile

import (
	"encoding/binary"
	"syscall"
)

// The parts of the FUSE protocol (include/uapi/linux/fuse.h, 7.45) one
// regular file needs. Written out here because no FUSE library available to
// us speaks FUSE over io_uring (see the package comment), and the two
// transports share these layouts.

var le = binary.LittleEndian

const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opSetattr     = 4
	opOpen        = 14
	opRead        = 15
	opWrite       = 16
	opStatfs      = 17
	opRelease     = 18
	opFsync       = 20
	opGetxattr    = 22
	opListxattr   = 23
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opAccess      = 34
	opInterrupt   = 36
	opDestroy     = 38
	opBatchForget = 42
	opFallocate   = 43

	inHeaderSize  = 40 // struct fuse_in_header
	outHeaderSize = 16 // struct fuse_out_header

	rootID = 1
	fileID = 2

	// INIT flags (flags | flags2<<32).
	initAsyncRead   = 1 << 0
	initBigWrites   = 1 << 5
	initAsyncDIO    = 1 << 15
	initMaxPages    = 1 << 22
	initFlagsExt    = 1 << 30
	initOverIOUring = 1 << 41

	openDirectIO             = 1 << 0 // FOPEN_DIRECT_IO
	openParallelDirectWrites = 1 << 6 // FOPEN_PARALLEL_DIRECT_WRITES

	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
	fallocZeroRange = 0x10
)

// inSize is the fixed argument (in_args[0]) of each opcode served; what
// follows it (a name, write data) is the payload.
func inSize(op uint32) int {
	switch op {
	case opGetattr, opFsync:
		return 16
	case opOpen, opOpendir, opAccess, opGetxattr, opListxattr, opForget, opInterrupt, opBatchForget:
		return 8
	case opRead, opWrite, opReaddir:
		return 40
	case opFlush, opRelease, opReleasedir:
		return 24
	case opFallocate:
		return 32
	case opSetattr:
		return 88
	case opInit:
		return 64
	}
	return 0
}

// request is one FUSE request as both transports present it.
type request struct {
	header  []byte // fuse_in_header
	in      []byte // the opcode's fixed argument, inSize(op) bytes or fewer
	payload []byte // what follows it
}

func (r request) opcode() uint32 { return le.Uint32(r.header[4:]) }
func (r request) unique() uint64 { return le.Uint64(r.header[8:]) }
func (r request) nodeID() uint64 { return le.Uint64(r.header[16:]) }

// blocks says whether serving op waits on the device; those run on their
// own goroutine so one slow request does not hold up the others.
func blocks(op uint32) bool {
	switch op {
	case opRead, opWrite, opFsync, opFallocate:
		return true
	}
	return false
}

// noReply: the kernel expects no answer to these.
func noReply(op uint32) bool {
	return op == opForget || op == opBatchForget || op == opInterrupt
}

func errno(e syscall.Errno) int32 { return -int32(e) }

// putAttr writes a struct fuse_attr (88 bytes) for the root or the file.
func putAttr(b []byte, node uint64, size int64) {
	clear(b[:88])
	le.PutUint64(b[0:], node)
	mode, nlink := uint32(syscall.S_IFDIR|0o755), uint32(2)
	if node == fileID {
		mode, nlink = syscall.S_IFREG|0o600, 1
		le.PutUint64(b[8:], uint64(size))
		le.PutUint64(b[16:], uint64((size+511)/512))
	}
	le.PutUint32(b[60:], mode)
	le.PutUint32(b[64:], nlink)
	le.PutUint32(b[80:], 4096) // blksize
}

// putInitOut writes struct fuse_init_out (64 bytes) accepting what the
// kernel offered of want.
func putInitOut(b []byte, minor uint32, offered, want uint64, maxWrite int) {
	clear(b[:64])
	got := offered & want
	le.PutUint32(b[0:], 7)
	le.PutUint32(b[4:], minor)
	le.PutUint32(b[8:], 128<<10) // max_readahead
	le.PutUint32(b[12:], uint32(got))
	le.PutUint16(b[16:], 64) // max_background
	le.PutUint16(b[18:], 48) // congestion_threshold
	le.PutUint32(b[20:], uint32(maxWrite))
	le.PutUint32(b[24:], 1) // time_gran
	le.PutUint16(b[28:], uint16(maxWrite/4096))
	le.PutUint32(b[32:], uint32(got>>32))
}

// putDirents lists ".", ".." and the file from offset on, as struct
// fuse_dirent records, into b; it returns the bytes used.
func putDirents(b []byte, name string, offset uint64) int {
	entries := []struct {
		ino  uint64
		name string
		typ  uint32
	}{{rootID, ".", syscall.DT_DIR}, {rootID, "..", syscall.DT_DIR}, {fileID, name, syscall.DT_REG}}
	n := 0
	for i := int(offset); i < len(entries); i++ {
		e := entries[i]
		size := (24 + len(e.name) + 7) &^ 7
		if n+size > len(b) {
			break
		}
		clear(b[n : n+size])
		le.PutUint64(b[n:], e.ino)
		le.PutUint64(b[n+8:], uint64(i+1)) // the offset of the next entry
		le.PutUint32(b[n+16:], uint32(len(e.name)))
		le.PutUint32(b[n+20:], e.typ)
		copy(b[n+24:], e.name)
		n += size
	}
	return n
}
