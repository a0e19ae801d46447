package fusefile

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
)

// readLoop serves /dev/fuse by read and write: INIT, FORGETs (which never
// use the rings), and every request when there are no rings. It returns
// when the connection ends.
func (s *Server) readLoop() {
	for {
		buf := s.buffer()
		n, err := syscall.Read(s.fd, *buf)
		switch {
		case errors.Is(err, syscall.EINTR), errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.ENOENT):
			s.buffers.Put(buf) // ENOENT: the request was interrupted before we read it
			continue
		case err != nil: // ENODEV: unmounted or aborted
			s.buffers.Put(buf)
			s.initDone(fmt.Errorf("fusefile: the connection ended before INIT: %w", err))
			return
		case n < inHeaderSize:
			s.buffers.Put(buf)
			s.log.WithField("bytes", n).Warn("FUSE: short request ignored")
			continue
		}
		req := splitRequest((*buf)[:n])
		op := req.opcode()
		if op == opInit {
			s.init(req)
			s.buffers.Put(buf)
			continue
		}
		if noReply(op) {
			s.buffers.Put(buf)
			continue
		}
		if !blocks(op) {
			s.reply(req, buf)
			continue
		}
		s.readers.Go(func() { s.reply(req, buf) })
	}
}

// splitRequest cuts a request read from /dev/fuse into its parts.
func splitRequest(b []byte) request {
	body := b[inHeaderSize:]
	in := min(inSize(le.Uint32(b[4:])), len(body))
	return request{header: b[:inHeaderSize], in: body[:in], payload: body[in:]}
}

// reply serves req and writes the answer; buf (holding req) goes back to
// the pool after.
func (s *Server) reply(req request, buf *[]byte) {
	out := s.buffer()
	status, n := s.serve(req, (*out)[outHeaderSize:])
	le.PutUint32((*out)[0:], uint32(outHeaderSize+n))
	le.PutUint32((*out)[4:], uint32(status))
	le.PutUint64((*out)[8:], req.unique())
	// ENOENT: the request was interrupted and is gone; nothing to do.
	if _, err := syscall.Write(s.fd, (*out)[:outHeaderSize+n]); err != nil && !errors.Is(err, syscall.ENOENT) &&
		!errors.Is(err, syscall.ENODEV) {
		s.log.WithError(err).WithField("opcode", req.opcode()).Warn("FUSE: writing a reply failed")
	}
	s.buffers.Put(out)
	s.buffers.Put(buf)
}

// buffer returns a request- or reply-sized buffer from the pool.
func (s *Server) buffer() *[]byte {
	return s.buffers.Get().(*[]byte)
}

func newBufferPool(maxWrite int) *sync.Pool {
	return &sync.Pool{New: func() any {
		b := make([]byte, maxWrite+4096) // a WRITE's data plus its headers
		return &b
	}}
}

// init answers FUSE_INIT: asynchronous direct I/O and large requests
// always, FUSE over io_uring when offered and wanted; then brings the
// rings up. Mount waits on s.ready for the outcome.
func (s *Server) init(req request) {
	if len(req.in) < 24 {
		s.initDone(errors.New("fusefile: INIT request too short"))
		return
	}
	major, minor := le.Uint32(req.in[0:]), le.Uint32(req.in[4:])
	offered := uint64(le.Uint32(req.in[12:])) | uint64(le.Uint32(req.in[16:]))<<32
	if major != 7 || minor < 31 {
		s.initDone(fmt.Errorf("fusefile: kernel FUSE protocol %d.%d; want 7.31 or later", major, minor))
		return
	}
	want := uint64(initAsyncRead | initBigWrites | initAsyncDIO | initMaxPages | initFlagsExt)
	if !s.classic {
		want |= initOverIOUring
	}
	var out [outHeaderSize + 64]byte
	putInitOut(out[outHeaderSize:], minor, offered, want, s.maxWrite)
	le.PutUint32(out[0:], uint32(len(out)))
	le.PutUint64(out[8:], req.unique())
	if _, err := syscall.Write(s.fd, out[:]); err != nil {
		s.initDone(fmt.Errorf("fusefile: answering INIT: %w", err))
		return
	}
	if offered&want&initOverIOUring != 0 {
		r, err := startRings(s)
		if err != nil {
			// The kernel uses the rings only once every queue has
			// registered, so requests keep coming by read: slower, not
			// broken. Queues already serving end with the connection.
			s.log.WithError(err).Warn("FUSE over io_uring offered but its queues failed; serving by /dev/fuse reads")
			s.failed = r
		} else {
			s.rings = r
		}
	}
	s.initDone(nil)
}

// initDone reports INIT's outcome to Mount once.
func (s *Server) initDone(err error) {
	select {
	case s.ready <- err:
	default:
	}
}
