package dataconn

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/strata-storage/strata/engine/internal/drain"
	"github.com/strata-storage/strata/engine/internal/inflight"
	"io"
	"math"
	"net"
	"runtime"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
)

// Ordering on one connection, which the engine relies on:
//   - FLUSH and CONTROL are barriers: the reader waits until every earlier
//     request has completed, runs the barrier itself, and reads nothing
//     more until it is done.
//   - Data requests between barriers run concurrently, but a request waits
//     for every earlier in-flight request it overlaps when either of them
//     modifies data, so overlapping writes apply in order and a read sees
//     exactly the writes sent before it.
//   - SIZE and PING touch no data and run at once, in the reader.
//
// Responses go out as requests complete, in any order, through a single
// writer goroutine.

const (
	readBufSize = 64 << 10
	maxBatch    = 128 // responses per vectored write
)

type serverConn struct {
	s    *Server
	conn net.Conn
	log  logrus.FieldLogger
	out  chan *response // to the writer; never blocks: see newServerConn
	lim  *inflight.Limiter

	inflight sync.WaitGroup // dispatched data requests not yet answered
	mu       sync.Mutex
	active   []*activeOp // dispatched data requests not yet completed
}

type request struct {
	hdr     RequestHeader
	payload []byte
	buf     *[]byte // pooled backing of payload, if any
	weight  int64
}

type response struct {
	hdr     ResponseHeader
	payload []byte
	buf     *[]byte // pooled backing of payload, if any
	weight  int64   // returned to the limiter once written
}

// activeOp is a dispatched data request, for overlap checks.
type activeOp struct {
	off, end int64
	modifies bool
	done     chan struct{}
}

func newServerConn(s *Server, conn net.Conn) *serverConn {
	return &serverConn{
		s:    s,
		conn: conn,
		log:  s.log.WithFields(logrus.Fields{"remote": conn.RemoteAddr().String(), "local": conn.LocalAddr().String()}),
		// Every response holds a limiter slot until written, so at most
		// maxInFlight responses exist and sends to out never block.
		out: make(chan *response, s.cfg.maxInFlight),
		lim: inflight.New(s.cfg.maxInFlight, s.cfg.maxInFlightBytes),
	}
}

func (sc *serverConn) run() {
	sc.log.Debug("Data connection opened")
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		sc.writeLoop()
	}()
	err := sc.readLoop()
	switch {
	case err == nil || errors.Is(err, net.ErrClosed):
		sc.log.Debug("Data connection closed")
	case errors.Is(err, ErrProtocol):
		sc.log.WithError(err).Warn("Closing data connection on a malformed request")
	default:
		sc.log.WithError(err).Info("Data connection lost")
	}
	// Answer what was admitted (or discard, if the socket is gone), then close.
	sc.inflight.Wait()
	close(sc.out)
	<-writerDone
	sc.conn.Close()
}

// readLoop reads requests and dispatches them in order. It returns nil on
// a clean end of stream.
func (sc *serverConn) readLoop() error {
	br := bufio.NewReaderSize(sc.conn, readBufSize)
	var hb [RequestHeaderSize]byte
	for {
		h, err := ReadRequestHeader(br, hb[:])
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		req := &request{hdr: h, weight: int64(h.PayloadLen)}
		if h.Op == OpRead {
			req.weight = int64(h.Length)
		}
		sc.lim.Acquire(req.weight) // backpressure: stop reading when full
		if h.PayloadLen > 0 {
			if h.Op == OpControl {
				// Control handlers may keep their args; do not pool them.
				req.payload = make([]byte, h.PayloadLen)
			} else {
				req.buf = getBuf(int(h.PayloadLen))
				req.payload = *req.buf
			}
			if _, err := io.ReadFull(br, req.payload); err != nil {
				putBuf(req.buf)
				sc.lim.Release(req.weight)
				return fmt.Errorf("reading %s payload: %w", h.Op, err)
			}
		}
		switch h.Op {
		case OpRead, OpWrite, OpUnmap, OpWriteZeroes:
			sc.dispatch(req)
		case OpFlush, OpControl:
			if sc.s.unordered {
				sc.dispatchUnordered(req)
				continue
			}
			sc.inflight.Wait()
			sc.out <- sc.execute(req)
		default:
			sc.out <- sc.execute(req)
		}
	}
}

// dispatch starts a data request once the earlier requests it conflicts
// with have completed.
func (sc *serverConn) dispatch(req *request) {
	a := &activeOp{modifies: req.hdr.Op != OpRead, done: make(chan struct{})}
	a.off, a.end = span(req.hdr)
	var deps []*activeOp
	sc.mu.Lock()
	for _, b := range sc.active {
		if sc.s.unordered {
			break
		}
		if (a.modifies || b.modifies) && a.off < b.end && b.off < a.end {
			deps = append(deps, b)
		}
	}
	sc.active = append(sc.active, a)
	sc.mu.Unlock()

	sc.inflight.Add(1)
	go func() {
		defer sc.inflight.Done()
		// Waiting for direct predecessors suffices: each of them waited for
		// its own before starting.
		for _, d := range deps {
			<-d.done
		}
		resp := sc.execute(req)
		sc.mu.Lock()
		for i, b := range sc.active {
			if b == a {
				sc.active = append(sc.active[:i], sc.active[i+1:]...)
				break
			}
		}
		sc.mu.Unlock()
		close(a.done)
		sc.out <- resp
	}()
}

// dispatchUnordered runs a barrier request with no ordering at all
// (test-only broken server).
func (sc *serverConn) dispatchUnordered(req *request) {
	sc.inflight.Add(1)
	go func() {
		defer sc.inflight.Done()
		sc.out <- sc.execute(req)
	}()
}

// span is the byte range a data request covers, clamped so that a bogus
// offset cannot overflow; execute rejects such requests anyway.
func span(h RequestHeader) (off, end int64) {
	off = max(h.Offset, 0)
	if off > math.MaxInt64-int64(h.Length) {
		return off, math.MaxInt64
	}
	return off, off + int64(h.Length)
}

// execute runs one request against the handler and builds its response.
func (sc *serverConn) execute(req *request) *response {
	h := req.hdr
	dev := sc.s.handler
	resp := &response{hdr: ResponseHeader{Seq: h.Seq}, weight: req.weight}
	var err error
	switch h.Op {
	case OpRead, OpWrite, OpUnmap, OpWriteZeroes:
		if h.Offset < 0 || h.Offset > math.MaxInt64-int64(h.Length) {
			err = fmt.Errorf("%w: offset %d length %d", blockdev.ErrOutOfRange, h.Offset, h.Length)
			break
		}
		switch h.Op {
		case OpRead:
			resp.buf = getBuf(int(h.Length))
			resp.payload = *resp.buf
			var n int
			n, err = dev.ReadAt(resp.payload, h.Offset)
			if n == len(resp.payload) && err == io.EOF {
				err = nil // io.ReaderAt may report EOF with a full read
			} else if err == nil && n < len(resp.payload) {
				err = io.ErrUnexpectedEOF
			}
		case OpWrite:
			var n int
			n, err = dev.WriteAt(req.payload, h.Offset)
			if err == nil && n < len(req.payload) {
				err = io.ErrShortWrite
			}
		case OpUnmap:
			err = dev.Unmap(h.Offset, int64(h.Length))
		case OpWriteZeroes:
			err = dev.WriteZeroes(h.Offset, int64(h.Length))
		}
	case OpFlush:
		err = dev.Flush()
	case OpSize:
		resp.payload = be.AppendUint64(make([]byte, 0, 8), uint64(dev.Size()))
	case OpPing:
	case OpControl:
		method := string(req.payload[:h.Length])
		var args []byte
		if len(req.payload) > int(h.Length) {
			args = req.payload[h.Length:]
		}
		var reply []byte
		reply, err = sc.s.handler.Control(sc.s.ctx, method, args)
		if err == nil && len(reply) > MaxPayload {
			err = fmt.Errorf("control %q reply of %d bytes exceeds %d", method, len(reply), MaxPayload)
		}
		if err != nil {
			sc.log.WithError(err).WithField("method", method).Debug("Control call failed")
		}
		resp.payload = reply
	}
	putBuf(req.buf) // the device must not keep a WRITE payload (io.WriterAt)
	req.buf, req.payload = nil, nil
	if err != nil {
		putBuf(resp.buf)
		resp.buf = nil
		resp.hdr.Status = statusOf(err)
		resp.payload = errorMessage(err)
	}
	resp.hdr.PayloadLen = uint32(len(resp.payload))
	return resp
}

// writeLoop sends responses, batching whatever is ready into one vectored
// write. After a write error it keeps draining so workers never block.
func (sc *serverConn) writeLoop() {
	fw := newFrameWriter(sc.conn)
	batch := make([]*response, 0, maxBatch)
	failed := false
	for r := range sc.out {
		batch = append(batch[:0], r)
		if len(r.payload) < inlinePayload {
			// Give workers finishing now a chance to join this write (see
			// Client.sendLoop).
			runtime.Gosched()
		}
		batch = drain.Into(sc.out, batch, maxBatch)
		if !failed {
			for _, r := range batch {
				fw.response(r.hdr, r.payload)
			}
			if err := fw.flush(); err != nil {
				failed = true
				if !errors.Is(err, net.ErrClosed) {
					sc.log.WithError(err).Info("Writing responses failed; closing the connection")
				}
				sc.conn.Close() // unblocks the reader
			}
		}
		for i, r := range batch {
			putBuf(r.buf)
			sc.lim.Release(r.weight)
			batch[i] = nil
		}
	}
}

// setConn replaces the connection (by its TLS wrapping) before run; under
// the server's lock, which Close holds while it closes connections.
func (sc *serverConn) setConn(c net.Conn) {
	sc.s.mu.Lock()
	sc.conn = c
	sc.s.mu.Unlock()
}
