package fusefile

import (
	"bytes"
	"syscall"
)

// attrValid is how long (seconds) the kernel may cache the file's
// attributes: short, so a volume expansion shows within a second.
const attrValid = 1

// serve answers one request other than INIT. The reply's arguments go to
// out (READ's data too); it returns the status (0 or a negative errno) and
// the length written to out. In ring mode out and req.payload share a
// buffer, so each case reads what it needs before writing.
func (s *Server) serve(req request, out []byte) (int32, int) {
	node := req.nodeID()
	switch op := req.opcode(); op {
	case opLookup:
		name := string(bytes.TrimRight(req.payload, "\x00"))
		if node != rootID || name != s.name {
			return errno(syscall.ENOENT), 0
		}
		clear(out[:40])
		le.PutUint64(out[0:], fileID)
		le.PutUint64(out[24:], attrValid) // attr_valid; entry_valid 0: looked up again each open
		putAttr(out[40:], fileID, s.dev.Size())
		return 0, 128
	case opGetattr, opSetattr:
		// SETATTR changes nothing (the file is the device; its size is the
		// volume's) and answers with the attributes as they are.
		clear(out[:16])
		le.PutUint64(out[0:], attrValid)
		putAttr(out[16:], node, s.dev.Size())
		return 0, 104
	case opOpen, opOpendir:
		clear(out[:16])
		if op == opOpen {
			// Direct I/O: the device is the cache-free path the loop device
			// expects; parallel writes: the engine orders nothing per file.
			le.PutUint32(out[8:], openDirectIO|openParallelDirectWrites)
		}
		return 0, 16
	case opRead:
		return s.read(req, out)
	case opWrite:
		return s.write(req, out)
	case opFsync:
		if err := s.dev.Flush(); err != nil {
			s.log.WithError(err).Warn("FUSE fsync: flushing the device failed")
			return errno(syscall.EIO), 0
		}
		return 0, 0
	case opFallocate:
		return s.fallocate(req), 0
	case opReaddir:
		if len(req.in) < 24 {
			return errno(syscall.EINVAL), 0
		}
		size := min(int(le.Uint32(req.in[16:])), len(out))
		return 0, putDirents(out[:size], s.name, le.Uint64(req.in[8:]))
	case opStatfs:
		clear(out[:80]) // a file system of one file; df has nothing to say
		le.PutUint32(out[48:], 4096)
		le.PutUint32(out[52:], 255)
		le.PutUint32(out[56:], 4096)
		return 0, 80
	case opFlush, opRelease, opReleasedir, opAccess, opDestroy:
		return 0, 0
	case opGetxattr, opListxattr:
		return errno(syscall.EOPNOTSUPP), 0
	}
	return errno(syscall.ENOSYS), 0
}

// span reads offset and size from a READ or WRITE's fuse_read_in /
// fuse_write_in and checks them against the device.
func (s *Server) span(req request) (off int64, size int, status int32) {
	if len(req.in) < 24 {
		return 0, 0, errno(syscall.EINVAL)
	}
	off, size = int64(le.Uint64(req.in[8:])), int(le.Uint32(req.in[16:]))
	if off < 0 || size > s.maxWrite {
		return 0, 0, errno(syscall.EINVAL)
	}
	return off, size, 0
}

func (s *Server) read(req request, out []byte) (int32, int) {
	off, size, st := s.span(req)
	if st != 0 {
		return st, 0
	}
	size = int(min(int64(size), max(s.dev.Size()-off, 0))) // short at the end, as a file reads
	if size == 0 {
		return 0, 0
	}
	if _, err := s.dev.ReadAt(out[:size], off); err != nil {
		s.log.WithError(err).WithField("offset", off).Warn("FUSE read failed")
		return errno(syscall.EIO), 0
	}
	return 0, size
}

func (s *Server) write(req request, out []byte) (int32, int) {
	off, size, st := s.span(req)
	if st != 0 {
		return st, 0
	}
	if size > len(req.payload) {
		return errno(syscall.EINVAL), 0
	}
	if off+int64(size) > s.dev.Size() {
		return errno(syscall.ENOSPC), 0 // a device does not grow by writing
	}
	if _, err := s.dev.WriteAt(req.payload[:size], off); err != nil {
		s.log.WithError(err).WithField("offset", off).Warn("FUSE write failed")
		return errno(syscall.EIO), 0
	}
	clear(out[:8])
	le.PutUint32(out[0:], uint32(size))
	return 0, 8
}

// fallocate passes a punched hole or a zeroed range on as WriteZeroes: the
// loop device sends both its discards and its write-zeroes as punched
// holes, and ext4 and xfs zero ranges that way and rely on reading zeros
// back, so a hole cannot be an advisory Unmap. A replica's WriteZeroes
// frees what it can and allocates nothing over its snapshots' data (zero
// marks, engine/replica/zeromarks.go). Allocating is a no-op on a device
// of fixed size.
func (s *Server) fallocate(req request) int32 {
	if len(req.in) < 28 {
		return errno(syscall.EINVAL)
	}
	off, length, mode := int64(le.Uint64(req.in[8:])), int64(le.Uint64(req.in[16:])), le.Uint32(req.in[24:])
	if off < 0 || length <= 0 || off+length > s.dev.Size() {
		return errno(syscall.EINVAL)
	}
	switch mode &^ fallocKeepSize {
	case 0:
		return 0
	case fallocPunchHole, fallocZeroRange:
		if err := s.dev.WriteZeroes(off, length); err != nil {
			s.log.WithError(err).WithField("offset", off).Warn("FUSE fallocate: zeroing failed")
			return errno(syscall.EIO)
		}
		return 0
	}
	return errno(syscall.EOPNOTSUPP)
}
