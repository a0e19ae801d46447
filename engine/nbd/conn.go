package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/strata-storage/strata/engine/internal/drain"
	"github.com/strata-storage/strata/engine/internal/inflight"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
)

// conn is one client connection: the handshake, then the transmission phase
// in which a reader goroutine decodes requests, a bounded set of handler
// goroutines executes them against the device, and a writer goroutine sends
// the replies (batched into one writev where several are ready).
type conn struct {
	srv       *Server
	nc        net.Conn
	log       *logrus.Entry
	exp       *export // set by Server.attach
	done      chan struct{}
	closeOnce sync.Once

	br       *bufio.Reader
	noZeroes bool

	replies  chan *reply
	lim      *inflight.Limiter
	handlers sync.WaitGroup
}

func (c *conn) close() { c.closeOnce.Do(func() { c.nc.Close() }) }

func (c *conn) serve() {
	defer func() {
		c.close()
		c.srv.detach(c)
		close(c.done)
		c.srv.wg.Done()
	}()
	c.br = bufio.NewReaderSize(c.nc, 64<<10)
	e, err := c.handshake()
	if err != nil {
		if isClosedErr(err) {
			c.log.WithError(err).Debug("Connection closed during handshake")
		} else {
			c.log.WithError(err).Warn("NBD handshake failed")
		}
		return
	}
	if e == nil {
		c.log.Debug("Client aborted the handshake")
		return
	}
	c.transmit(e)
}

func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// handshake runs the fixed newstyle negotiation. It returns the export the
// client selected (already attached), nil if the client aborted, or an error.
func (c *conn) handshake() (*export, error) {
	if err := c.nc.SetDeadline(time.Now().Add(c.srv.opts.HandshakeTimeout)); err != nil {
		return nil, fmt.Errorf("setting handshake deadline: %w", err)
	}
	var hello [18]byte
	binary.BigEndian.PutUint64(hello[0:8], magicInit)
	binary.BigEndian.PutUint64(hello[8:16], magicOption)
	binary.BigEndian.PutUint16(hello[16:18], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.nc.Write(hello[:]); err != nil {
		return nil, fmt.Errorf("sending greeting: %w", err)
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		return nil, fmt.Errorf("reading client flags: %w", err)
	}
	clientFlags := binary.BigEndian.Uint32(cf[:])
	if bad := clientFlags &^ (flagCFixedNewstyle | flagCNoZeroes); bad != 0 {
		return nil, fmt.Errorf("client set unknown flags %#x", bad)
	}
	if clientFlags&flagCFixedNewstyle == 0 {
		return nil, errors.New("client does not support the fixed newstyle handshake")
	}
	c.noZeroes = clientFlags&flagCNoZeroes != 0

	bw := bufio.NewWriterSize(c.nc, 4096)
	for {
		opt, err := ReadOption(c.br, MaxOptionLen)
		if errors.Is(err, ErrTooBig) && opt.Code != OptExportName {
			c.log.WithError(err).WithField("option", OptionName(opt.Code)).Warn("Rejecting oversized option")
			if err := c.optReply(bw, opt.Code, RepErrTooBig, err.Error()); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading option: %w", err)
		}
		log := c.log.WithField("option", OptionName(opt.Code))
		log.Debug("Option received")
		switch opt.Code {
		case OptExportName:
			name, err := ParseExportName(opt.Data)
			if err != nil {
				return nil, fmt.Errorf("NBD_OPT_EXPORT_NAME: %w", err)
			}
			e := c.srv.attach(c, name)
			if e == nil {
				return nil, fmt.Errorf("NBD_OPT_EXPORT_NAME: export %q not found", name)
			}
			var b [8 + 2 + 124]byte
			binary.BigEndian.PutUint64(b[0:8], uint64(e.advertisedSize()))
			binary.BigEndian.PutUint16(b[8:10], e.flags())
			n := len(b)
			if c.noZeroes {
				n = 10
			}
			if _, err := bw.Write(b[:n]); err != nil {
				return nil, err
			}
			if err := bw.Flush(); err != nil {
				return nil, fmt.Errorf("sending export info: %w", err)
			}
			return e, nil

		case OptAbort:
			// The client may already have gone; the ACK is best effort.
			_ = c.optReply(bw, opt.Code, RepAck, "")
			return nil, nil

		case OptList:
			if len(opt.Data) != 0 {
				if err := c.optReply(bw, opt.Code, RepErrInvalid, "NBD_OPT_LIST carries no data"); err != nil {
					return nil, err
				}
				continue
			}
			for _, name := range c.srv.Exports() {
				d := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(name)), uint32(len(name)))
				if _, err := bw.Write(appendOptionReply(nil, opt.Code, RepServer, append(d, name...))); err != nil {
					return nil, err
				}
			}
			if err := c.optReply(bw, opt.Code, RepAck, ""); err != nil {
				return nil, err
			}

		case OptInfo, OptGo:
			req, err := ParseInfoRequest(opt.Data)
			if err != nil {
				log.WithError(err).Warn("Rejecting malformed option")
				if err := c.optReply(bw, opt.Code, RepErrInvalid, err.Error()); err != nil {
					return nil, err
				}
				continue
			}
			var e *export
			if opt.Code == OptGo {
				e = c.srv.attach(c, req.Name)
			} else {
				e = c.srv.lookup(req.Name)
			}
			if e == nil {
				log.WithField("export", req.Name).Warn("Client asked for an unknown export")
				if err := c.optReply(bw, opt.Code, RepErrUnknown, fmt.Sprintf("export %q not found", req.Name)); err != nil {
					return nil, err
				}
				continue
			}
			if err := c.sendInfo(bw, opt.Code, e, req.Infos); err != nil {
				return nil, err
			}
			if opt.Code == OptGo {
				return e, nil
			}

		case OptStructuredReply:
			typ, msg := RepErrUnsup, "structured replies are not supported"
			if len(opt.Data) != 0 {
				typ, msg = RepErrInvalid, "NBD_OPT_STRUCTURED_REPLY carries no data"
			}
			if err := c.optReply(bw, opt.Code, typ, msg); err != nil {
				return nil, err
			}

		case OptListMetaContext, OptSetMetaContext:
			if err := c.optReply(bw, opt.Code, RepErrInvalid, "metadata contexts need structured replies, which were not negotiated"); err != nil {
				return nil, err
			}

		default:
			if err := c.optReply(bw, opt.Code, RepErrUnsup, fmt.Sprintf("option %s is not supported", OptionName(opt.Code))); err != nil {
				return nil, err
			}
		}
	}
}

// optReply sends one option reply, with msg as data (error replies carry a
// human-readable message).
func (c *conn) optReply(bw *bufio.Writer, code, typ uint32, msg string) error {
	if _, err := bw.Write(appendOptionReply(nil, code, typ, []byte(msg))); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("sending reply to option %s: %w", OptionName(code), err)
	}
	return nil
}

// sendInfo answers NBD_OPT_INFO / NBD_OPT_GO for an export.
func (c *conn) sendInfo(bw *bufio.Writer, code uint32, e *export, infos []uint16) error {
	replies := [][]byte{
		infoExport(uint64(e.advertisedSize()), e.flags()),
		// Sent whether asked or not, as the protocol allows.
		infoBlockSize(MinBlockSize, PreferredBlockSize, MaxPayload),
	}
	for _, i := range infos {
		switch i {
		case InfoName:
			replies = append(replies, infoString(InfoName, e.name))
		case InfoDescription:
			if e.description != "" {
				replies = append(replies, infoString(InfoDescription, e.description))
			}
		}
	}
	for _, r := range replies {
		if _, err := bw.Write(appendOptionReply(nil, code, RepInfo, r)); err != nil {
			return err
		}
	}
	return c.optReply(bw, code, RepAck, "")
}

// reply is a queued simple reply with its optional READ payload.
type reply struct {
	hdr  [SimpleReplyHeaderSize]byte
	buf  *[]byte
	cost int
}

var replyPool = sync.Pool{New: func() any { return new(reply) }}

func newReply(errno uint32, cookie uint64, cost int) *reply {
	r := replyPool.Get().(*reply)
	putSimpleReply(r.hdr[:], errno, cookie)
	r.buf, r.cost = nil, cost
	return r
}

// transmit runs the transmission phase until the client disconnects, the
// connection is closed, or the client violates the protocol.
func (c *conn) transmit(e *export) {
	if err := c.nc.SetDeadline(time.Time{}); err != nil {
		c.log.WithError(err).Warn("Clearing the handshake deadline failed")
	}
	c.log = c.log.WithField("export", e.name)
	c.replies = make(chan *reply, c.srv.opts.MaxInflight)
	c.lim = inflight.New(c.srv.opts.MaxInflight, int64(c.srv.opts.MaxInflightBytes))
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writeLoop()
	}()
	c.log.Info("NBD client connected")
	err := c.readLoop(e)
	c.handlers.Wait()
	close(c.replies)
	<-writerDone
	switch {
	case err == nil:
		c.log.Info("NBD client disconnected")
	case isClosedErr(err):
		c.log.WithError(err).Info("NBD connection closed")
	default:
		c.log.WithError(err).Warn("NBD connection dropped")
	}
}

// readLoop reads requests and dispatches them; it returns nil on
// NBD_CMD_DISC.
func (c *conn) readLoop(e *export) error {
	size := e.advertisedSize()
	var hdr [RequestHeaderSize]byte
	for {
		req, err := ReadRequest(c.br, hdr[:])
		if err != nil {
			if errors.Is(err, ErrBadMagic) {
				return fmt.Errorf("malformed request, disconnecting: %w", err)
			}
			return fmt.Errorf("reading request: %w", err)
		}
		if req.Type == CmdDisc {
			return nil
		}
		if errno, reason := CheckRequest(req, e.boundFor(size), e.readOnly); errno != 0 {
			c.log.WithFields(logrus.Fields{
				"cmd": CommandName(req.Type), "flags": req.Flags, "offset": req.Offset, "length": req.Length,
				"errno": errno, "reason": reason,
			}).Warn("Rejecting NBD request")
			if req.Type == CmdWrite && req.Length > 0 {
				if _, err := io.CopyN(io.Discard, c.br, int64(req.Length)); err != nil {
					return fmt.Errorf("discarding the %d-byte payload of a rejected write: %w", req.Length, err)
				}
			}
			c.lim.Acquire(0)
			c.replies <- newReply(errno, req.Cookie, 0)
			continue
		}
		cost := 0
		if req.Type == CmdRead || req.Type == CmdWrite {
			cost = int(req.Length)
		}
		c.lim.Acquire(int64(cost))
		var buf *[]byte
		if req.Type == CmdWrite && req.Length > 0 {
			buf = getBuf(int(req.Length))
			if _, err := io.ReadFull(c.br, *buf); err != nil {
				putBuf(buf)
				c.lim.Release(int64(cost))
				return fmt.Errorf("reading the %d-byte payload of a write at %d: %w", req.Length, req.Offset, err)
			}
		}
		c.handlers.Add(1)
		go c.handle(e, req, buf, cost)
	}
}

// handle executes one validated request and queues its reply.
func (c *conn) handle(e *export, req Request, buf *[]byte, cost int) {
	defer c.handlers.Done()
	dev := e.dev
	off, n := int64(req.Offset), int64(req.Length)
	fua := req.Flags&CmdFlagFUA != 0
	var data *[]byte
	var err error
	switch req.Type {
	case CmdRead:
		if n > 0 {
			data = getBuf(int(n))
			var got int
			got, err = dev.ReadAt(*data, off)
			if err == io.EOF && got == int(n) {
				err = nil
			}
			if err == nil && got != int(n) {
				// Never send the stale tail of a pooled buffer.
				err = fmt.Errorf("short read: %d of %d bytes: %w", got, n, io.ErrUnexpectedEOF)
			}
			if err != nil {
				putBuf(data)
				data = nil
			}
		}
	case CmdWrite:
		if n > 0 {
			var put int
			if put, err = dev.WriteAt(*buf, off); err == nil && put != int(n) {
				err = fmt.Errorf("short write: %d of %d bytes: %w", put, n, io.ErrShortWrite)
			}
			putBuf(buf)
		}
	case CmdFlush:
		err = dev.Flush()
	case CmdTrim:
		if n > 0 {
			if err = dev.Unmap(off, n); isNotSupported(err) {
				err = nil // trim is advisory
			}
		}
	case CmdWriteZeroes:
		if n > 0 {
			if req.Flags&CmdFlagNoHole != 0 && !c.srv.opts.IgnoreNoHole {
				err = writeZeroes(dev, off, n)
			} else if err = dev.WriteZeroes(off, n); isNotSupported(err) {
				err = writeZeroes(dev, off, n)
			}
		}
	}
	if err == nil && fua {
		err = dev.Flush()
	}
	var errno uint32
	if err != nil {
		errno = errnoFor(err, req.Type == CmdWrite || req.Type == CmdWriteZeroes)
		c.log.WithError(err).WithFields(logrus.Fields{
			"cmd": CommandName(req.Type), "offset": req.Offset, "length": req.Length, "errno": errno,
		}).Error("NBD request failed on the device")
	}
	r := newReply(errno, req.Cookie, cost)
	r.buf = data
	c.replies <- r
}

func isNotSupported(err error) bool {
	return err != nil && (errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, errors.ErrUnsupported))
}

// writeZeroes writes explicit zeros, so the range stays allocated.
func writeZeroes(dev blockdev.Device, off, n int64) error {
	z := zeroBuf()
	for n > 0 {
		k := min(n, int64(len(z)))
		if _, err := dev.WriteAt(z[:k], off); err != nil {
			return err
		}
		off += k
		n -= k
	}
	return nil
}

// errnoFor maps a device error to an NBD errno.
func errnoFor(err error, write bool) uint32 {
	switch {
	case errors.Is(err, blockdev.ErrOutOfRange):
		if write {
			return ENOSPC
		}
		return EINVAL
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ENOSPC
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EACCES):
		return EPERM
	case errors.Is(err, syscall.ENOMEM):
		return ENOMEM
	case errors.Is(err, syscall.EINVAL):
		return EINVAL
	}
	return EIO
}

// writeLoop sends replies, gathering every reply already queued into one
// vectored write. After a write error it keeps draining (to release
// resources) without writing.
func (c *conn) writeLoop() {
	const maxBatch = 64
	batch := make([]*reply, 0, maxBatch)
	vec := make(net.Buffers, 0, 2*maxBatch)
	failed := false
	for r := range c.replies {
		batch = append(batch[:0], r)
		batch = drain.Into(c.replies, batch, maxBatch)
		if !failed {
			vec = vec[:0]
			for _, r := range batch {
				vec = append(vec, r.hdr[:])
				if r.buf != nil {
					vec = append(vec, *r.buf)
				}
			}
			v := vec // WriteTo consumes its receiver
			if _, err := v.WriteTo(c.nc); err != nil {
				failed = true
				if !isClosedErr(err) {
					c.log.WithError(err).Warn("Sending NBD replies failed; closing the connection")
				}
				c.close()
			}
		}
		for i, r := range batch {
			putBuf(r.buf)
			c.lim.Release(int64(r.cost))
			r.buf = nil
			replyPool.Put(r)
			batch[i] = nil
		}
		clear(vec)
	}
}
