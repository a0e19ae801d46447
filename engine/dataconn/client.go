package dataconn

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
)

// Options tune a Client. The zero value is usable.
type Options struct {
	// Timeout bounds every call, including those given a context; 0 means
	// none. A timed-out request that was already sent may still be applied
	// by the replica, so a caller should treat the replica as suspect.
	Timeout time.Duration
	// StallTimeout bounds how long an abandoned (timed out or cancelled)
	// call waits for its buffers to leave the socket; past it the
	// connection is closed. Default 5s.
	StallTimeout time.Duration
	// Log receives connection events; default the logrus standard logger.
	Log logrus.FieldLogger
	// TLS, when set, authenticates the server (and this client to it)
	// before the first frame; nil speaks plain TCP (unit tests).
	TLS *tls.Config
	// Dialer, when set, dials the connection (a source address); default
	// a zero net.Dialer.
	Dialer *net.Dialer
	// Unencrypted, with TLS, authenticates both ends and then carries the
	// frames in the clear (see negotiate): for clusters whose network is
	// private and where encryption costs too much throughput.
	Unencrypted bool
}

// maxRangeChunk is the largest UNMAP/WRITE_ZEROES one frame carries; the
// length field is 32 bits.
const maxRangeChunk = 1 << 30

// Client is one pipelined data connection to a replica. It implements
// blockdev.Device; all methods are safe for concurrent use, and concurrent
// calls share the connection with many requests in flight.
type Client struct {
	addr string
	conn net.Conn
	opts Options
	log  logrus.FieldLogger
	size atomic.Int64 // last size the server reported
	wg   sync.WaitGroup

	mu      sync.Mutex
	nextSeq uint64
	pending map[uint64]*call // sent or queued, by seq
	queue   []*call          // not yet taken by the sender
	err     error            // set once the connection has failed
	closed  chan struct{}    // closed with err
	wake    chan struct{}    // the queue is not empty

	testHookEnqueue func(*call) // tests: observe seq order; called under mu
}

var _ blockdev.Device = (*Client)(nil)

// Dial connects to a dataconn server and checks it speaks the protocol by
// asking for the device size. ctx bounds the dial and that first call.
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	d := opts.Dialer
	if d == nil {
		d = &net.Dialer{}
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dataconn: dial %s: %w", addr, err)
	}
	if opts.TLS != nil {
		if conn, err = clientHandshake(ctx, conn, opts); err != nil {
			return nil, fmt.Errorf("dataconn: TLS handshake with %s: %w", addr, err)
		}
	}
	c := newClient(conn, addr, opts)
	if _, err := c.SizeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("dataconn: handshake with %s: %w", addr, err)
	}
	return c, nil
}

func newClient(conn net.Conn, addr string, opts Options) *Client {
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = 5 * time.Second
	}
	log := opts.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	c := &Client{
		addr:    addr,
		conn:    conn,
		opts:    opts,
		log:     log.WithFields(logrus.Fields{"component": "dataconn-client", "remote": addr}),
		pending: map[uint64]*call{},
		closed:  make(chan struct{}),
		wake:    make(chan struct{}, 1),
	}
	c.wg.Add(2)
	go c.sendLoop()
	go c.readLoop()
	return c
}

// Close fails every pending call with ErrConnectionClosed, closes the
// connection and waits for the client's goroutines to exit.
func (c *Client) Close() error {
	c.fail(errClientClosed)
	c.wg.Wait()
	return nil
}

// Done is closed when the connection has failed or been closed.
func (c *Client) Done() <-chan struct{} { return c.closed }

// Err is nil while the connection works, then why it stopped (it matches
// ErrConnectionClosed).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// ReadAt implements io.ReaderAt; see ReadAtContext.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	return c.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext reads len(p) bytes at off. Reads larger than MaxIOSize are
// split into pipelined requests. On error n counts the leading bytes read.
func (c *Client) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	calls := splitIO(OpRead, p, off)
	err := c.do(ctx, calls...)
	return doneBytes(calls, err), err
}

// WriteAt implements io.WriterAt; see WriteAtContext.
func (c *Client) WriteAt(p []byte, off int64) (int, error) {
	return c.WriteAtContext(context.Background(), p, off)
}

// WriteAtContext writes p at off. p is not retained after return, even on
// cancellation. On error n counts the leading bytes known written.
func (c *Client) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	calls := splitIO(OpWrite, p, off)
	err := c.do(ctx, calls...)
	return doneBytes(calls, err), err
}

func splitIO(op Op, p []byte, off int64) []*call {
	calls := make([]*call, 0, 1+len(p)/MaxIOSize)
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), MaxIOSize)
		h := RequestHeader{Op: op, Offset: off, Length: uint32(n)}
		if op == OpWrite {
			calls = append(calls, newCall(h, p[:n:n], nil))
		} else {
			calls = append(calls, newCall(h, nil, p[:n:n]))
		}
		p, off = p[n:], off+int64(n)
	}
	return calls
}

func doneBytes(calls []*call, err error) int {
	n := 0
	for _, cl := range calls {
		if err != nil && cl.err != nil {
			break
		}
		n += int(cl.hdr.Length)
	}
	return n
}

// Unmap implements blockdev.Device.
func (c *Client) Unmap(off, length int64) error {
	return c.UnmapContext(context.Background(), off, length)
}

// UnmapContext is Unmap with a context.
func (c *Client) UnmapContext(ctx context.Context, off, length int64) error {
	return c.rangeOp(ctx, OpUnmap, off, length)
}

// WriteZeroes implements blockdev.Device.
func (c *Client) WriteZeroes(off, length int64) error {
	return c.WriteZeroesContext(context.Background(), off, length)
}

// WriteZeroesContext is WriteZeroes with a context.
func (c *Client) WriteZeroesContext(ctx context.Context, off, length int64) error {
	return c.rangeOp(ctx, OpWriteZeroes, off, length)
}

func (c *Client) rangeOp(ctx context.Context, op Op, off, length int64) error {
	if length < 0 {
		return fmt.Errorf("dataconn: %s: %w: length %d", op, blockdev.ErrOutOfRange, length)
	}
	var calls []*call
	for first := true; first || length > 0; first = false {
		n := min(length, maxRangeChunk)
		calls = append(calls, newCall(RequestHeader{Op: op, Offset: off, Length: uint32(n)}, nil, nil))
		off, length = off+n, length-n
	}
	return c.do(ctx, calls...)
}

// Flush implements blockdev.Device. It is a barrier: it runs after every
// request sent before it and before any sent after it.
func (c *Client) Flush() error { return c.FlushContext(context.Background()) }

// FlushContext is Flush with a context.
func (c *Client) FlushContext(ctx context.Context) error {
	return c.do(ctx, newCall(RequestHeader{Op: OpFlush}, nil, nil))
}

// Size implements blockdev.Device, which has no error return: if the
// server cannot be asked it returns the last size it reported. Use
// SizeContext to see the error.
func (c *Client) Size() int64 {
	size, err := c.SizeContext(context.Background())
	if err != nil {
		c.log.WithError(err).Debug("SIZE failed; returning the last known size")
		return c.size.Load()
	}
	return size
}

// SizeContext asks the server for the device size.
func (c *Client) SizeContext(ctx context.Context) (int64, error) {
	cl := newCall(RequestHeader{Op: OpSize}, nil, nil)
	if err := c.do(ctx, cl); err != nil {
		return 0, err
	}
	size := int64(be.Uint64(cl.reply))
	if size < 0 {
		return 0, fmt.Errorf("dataconn: server reported size %d", size)
	}
	c.size.Store(size)
	return size, nil
}

// Ping checks the server answers. The server replies as soon as it reads
// the request, without waiting for data requests in flight (but a barrier
// being executed delays it, as it delays every later request).
func (c *Client) Ping(ctx context.Context) error {
	return c.do(ctx, newCall(RequestHeader{Op: OpPing}, nil, nil))
}

// Raw is CONTROL args or a reply that is not JSON, for bulk data a method
// documents as raw (JSON would cost a base64 round trip and a scan of every
// byte). As args it is sent as is; as reply (*Raw) it receives the reply
// bytes as is. Framing, limits and ordering are those of any CONTROL call.
type Raw []byte

// Control calls method on the server at this exact point of the request
// stream: it runs after every request sent before it has completed, and
// requests sent after it wait for it. args is marshalled to JSON (nil: no
// arguments; a json.RawMessage or Raw is sent as is); a non-nil reply
// receives the JSON result (a *Raw the bytes as they came).
func (c *Client) Control(ctx context.Context, method string, args any, reply any) error {
	if len(method) == 0 || len(method) > MaxMethodLen {
		return fmt.Errorf("dataconn: control method name of %d bytes: %w", len(method), ErrInvalidArgument)
	}
	var raw []byte
	switch a := args.(type) {
	case nil:
	case json.RawMessage:
		raw = a
	case Raw:
		raw = a
	default:
		var err error
		if raw, err = json.Marshal(args); err != nil {
			return fmt.Errorf("dataconn: control %s: encoding args: %w", method, err)
		}
	}
	if len(method)+len(raw) > MaxPayload {
		return fmt.Errorf("dataconn: control %s: %d bytes of args: %w", method, len(raw), ErrInvalidArgument)
	}
	payload := make([]byte, 0, len(method)+len(raw))
	payload = append(append(payload, method...), raw...)
	cl := newCall(RequestHeader{Op: OpControl, Length: uint32(len(method))}, payload, nil)
	if err := c.do(ctx, cl); err != nil {
		return fmt.Errorf("dataconn: control %s: %w", method, err)
	}
	if r, ok := reply.(*Raw); ok {
		*r = cl.reply // allocated for this call
		return nil
	}
	if reply != nil && len(cl.reply) > 0 {
		if err := json.Unmarshal(cl.reply, reply); err != nil {
			return fmt.Errorf("dataconn: control %s: decoding reply: %w", method, err)
		}
	}
	return nil
}
