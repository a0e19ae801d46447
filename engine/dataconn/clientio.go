package dataconn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"
)

// A call is one request in flight. Its buffers (payload, dst) belong to the
// caller, so the sender and reader take a hold on the call while they touch
// them; done is closed only once the call has a result and no holds, which
// is what lets a cancelled call return without the buffers still in use.
// All fields after hdr are guarded by Client.mu.
type call struct {
	hdr     RequestHeader
	payload []byte // request payload, read by the sender
	dst     []byte // READ destination, filled by the reader
	reply   []byte // SIZE and CONTROL result

	holds    int
	finished bool
	err      error
	done     chan struct{}
}

func newCall(h RequestHeader, payload, dst []byte) *call {
	h.PayloadLen = uint32(len(payload))
	return &call{hdr: h, payload: payload, dst: dst, done: make(chan struct{})}
}

func (c *Client) finishLocked(cl *call, err error) {
	if cl.finished {
		return
	}
	cl.finished, cl.err = true, err
	if cl.holds == 0 {
		close(cl.done)
	}
}

func (c *Client) releaseLocked(cl *call) {
	cl.holds--
	if cl.holds == 0 && cl.finished {
		close(cl.done)
	}
}

// do sends calls (consecutive seqs, so a split I/O stays together) and
// waits for all of them. It returns the first error in call order.
func (c *Client) do(ctx context.Context, calls ...*call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	for _, cl := range calls {
		c.nextSeq++
		cl.hdr.Seq = c.nextSeq
		c.pending[cl.hdr.Seq] = cl
		c.queue = append(c.queue, cl)
		if c.testHookEnqueue != nil {
			c.testHookEnqueue(cl)
		}
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // the sender is already due to look at the queue
	}
	return c.wait(ctx, calls)
}

func (c *Client) wait(ctx context.Context, calls []*call) error {
	var timeout <-chan time.Time
	if c.opts.Timeout > 0 {
		t := time.NewTimer(c.opts.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	for i, cl := range calls {
		var cause error
		select {
		case <-cl.done:
			continue
		case <-ctx.Done():
			cause = fmt.Errorf("dataconn: %s: %w", cl.hdr.Op, ctx.Err())
		case <-timeout:
			cause = fmt.Errorf("%w: %s after %v (%w)", ErrTimeout, cl.hdr.Op, c.opts.Timeout, context.DeadlineExceeded)
		}
		c.abandon(calls[i:], cause)
		break
	}
	for _, cl := range calls {
		if cl.err != nil {
			return cl.err
		}
	}
	return nil
}

// abandon gives up on calls: unsent ones are never sent, a late response
// is discarded. It returns once the sender and reader have let go of the
// callers' buffers; if that stalls, the connection is closed to force it.
func (c *Client) abandon(calls []*call, err error) {
	c.mu.Lock()
	for _, cl := range calls {
		if !cl.finished {
			c.finishLocked(cl, err)
			delete(c.pending, cl.hdr.Seq)
		}
	}
	c.mu.Unlock()
	var stall <-chan time.Time
	for _, cl := range calls {
		select {
		case <-cl.done:
			continue
		default:
		}
		if stall == nil {
			t := time.NewTimer(c.opts.StallTimeout)
			defer t.Stop()
			stall = t.C
		}
		select {
		case <-cl.done:
		case <-stall:
			c.fail(errors.New("an abandoned call's buffers stayed in transit past the stall timeout"))
			<-cl.done
		}
	}
}

// fail closes the connection and fails every pending call with
// ErrConnectionClosed; later calls fail the same way at once.
func (c *Client) fail(cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = fmt.Errorf("%w (%s): %w", ErrConnectionClosed, c.addr, cause)
	for _, cl := range c.pending {
		c.finishLocked(cl, c.err)
	}
	clear(c.pending)
	clear(c.queue)
	c.queue = c.queue[:0]
	close(c.closed)
	c.mu.Unlock()
	c.conn.Close()
	if errors.Is(cause, errClientClosed) {
		c.log.Debug("Data connection closed")
	} else {
		c.log.WithError(cause).Warn("Data connection failed")
	}
}

var errClientClosed = errors.New("closed by the client")

// sendLoop writes queued requests. Everything queued goes out in one
// vectored write, so pipelined small requests share syscalls while a lone
// request is sent at once.
func (c *Client) sendLoop() {
	defer c.wg.Done()
	fw := newFrameWriter(c.conn)
	var batch []*call
	for {
		select {
		case <-c.wake:
		case <-c.closed:
			return
		}
		c.mu.Lock()
		if smallBatch(c.queue) {
			// Let callers that are about to enqueue do so first: one
			// syscall for many small requests is worth a yield, which
			// costs next to nothing when nobody else is runnable.
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		batch, c.queue = c.queue, batch[:0]
		n := 0
		for _, cl := range batch {
			if !cl.finished { // abandoned before it was sent
				cl.holds++
				batch[n] = cl
				n++
			}
		}
		clear(batch[n:])
		batch = batch[:n]
		c.mu.Unlock()

		for _, cl := range batch {
			fw.request(cl.hdr, cl.payload)
		}
		err := fw.flush()

		c.mu.Lock()
		for _, cl := range batch {
			c.releaseLocked(cl)
		}
		c.mu.Unlock()
		clear(batch)
		if err != nil {
			c.fail(fmt.Errorf("sending requests: %w", err))
			return
		}
	}
}

func smallBatch(q []*call) bool {
	n := 0
	for _, cl := range q {
		n += len(cl.payload)
	}
	return n < inlinePayload
}

// readLoop matches responses to pending calls by seq until the connection
// fails.
func (c *Client) readLoop() {
	defer c.wg.Done()
	br := bufio.NewReaderSize(c.conn, readBufSize)
	var hb [ResponseHeaderSize]byte
	for {
		h, err := ReadResponseHeader(br, hb[:])
		if err == nil {
			err = c.receive(br, h)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

func (c *Client) receive(br *bufio.Reader, h ResponseHeader) error {
	c.mu.Lock()
	if h.Seq == 0 || h.Seq > c.nextSeq {
		c.mu.Unlock()
		return protoErr("response for seq %d, which was never sent", h.Seq)
	}
	cl := c.pending[h.Seq]
	if cl == nil {
		// The call was abandoned; its response still has to be consumed.
		c.mu.Unlock()
		_, err := br.Discard(int(h.PayloadLen))
		return err
	}
	if err := checkReply(cl.hdr, h); err != nil {
		c.mu.Unlock()
		return err
	}
	delete(c.pending, h.Seq)
	var into []byte
	if h.Status == StatusOK && cl.hdr.Op == OpRead {
		into = cl.dst // read straight into the caller's buffer
		cl.holds++
	}
	c.mu.Unlock()

	payload := into
	if into == nil && h.PayloadLen > 0 {
		payload = make([]byte, h.PayloadLen) // small or rare: SIZE, CONTROL, errors
	}
	_, err := io.ReadFull(br, payload)

	c.mu.Lock()
	defer c.mu.Unlock()
	if into != nil {
		c.releaseLocked(cl)
	}
	switch {
	case err != nil:
		// fail() no longer sees this call in pending; finish it here.
		c.finishLocked(cl, fmt.Errorf("%w (%s): reading response: %w", ErrConnectionClosed, c.addr, err))
		return err
	case h.Status != StatusOK:
		c.finishLocked(cl, &RemoteError{Op: cl.hdr.Op, Status: h.Status, Message: string(payload)})
	default:
		if into == nil {
			cl.reply = payload
		}
		c.finishLocked(cl, nil)
	}
	return nil
}

// checkReply rejects a successful response whose payload does not fit the
// request; a server that sends one cannot be trusted with the stream.
func checkReply(req RequestHeader, h ResponseHeader) error {
	if h.Status != StatusOK {
		return nil
	}
	want := -1 // any length
	switch req.Op {
	case OpRead:
		want = int(req.Length)
	case OpSize:
		want = 8
	case OpControl:
	default:
		want = 0
	}
	if want >= 0 && int(h.PayloadLen) != want {
		return protoErr("%s reply with %d payload bytes, want %d", req.Op, h.PayloadLen, want)
	}
	return nil
}
