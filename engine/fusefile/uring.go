package fusefile

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// The io_uring side (include/uapi/linux/io_uring.h): the rings are used
// through their mmap'd memory and io_uring_enter, as liburing does.
const (
	sysIOURingSetup = 425
	sysIOURingEnter = 426

	setupSQE128     = 1 << 10
	enterGetEvents  = 1 << 0
	offSQRing       = 0
	offSQEs         = 0x10000000
	sqeSize         = 128 // SQE128: the FUSE command needs the large SQE
	cqeSize         = 16
	opURingCmd      = 46
	opReadFixedless = 22 // IORING_OP_READ, for the wake-up eventfd

	cmdRegister       = 1 // FUSE_IO_URING_CMD_REGISTER
	cmdCommitAndFetch = 2 // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

	// struct fuse_uring_req_header: in_out[128] op_in[128] ring_ent_in_out[32].
	ringHeaderSize = 288
	ringOpIn       = 128
	ringEntInOut   = 256

	wakeTag = 1 << 63 // user_data of the eventfd read
)

// entriesPerQueue is how many requests each CPU's queue holds at once: a
// loop device keeps up to 16 in flight from one CPU, and memory is only
// touched where a request lands.
const entriesPerQueue = 16

type rings struct {
	queues []*queue
	wg     sync.WaitGroup
}

// entry is one registered request slot: headers, the iovecs naming them
// for the kernel, and the payload, in memory the Go runtime never moves.
type entry struct {
	mem     []byte
	hdr     []byte
	payload []byte
}

type queue struct {
	s  *Server
	id int
	fd int

	ringMem, sqeMem                  []byte
	sqTail, sqMask, sqArray, sqeBase unsafe.Pointer
	cqHead, cqTail, cqMask, cqes     unsafe.Pointer
	ents                             []*entry
	live                             int // entries the kernel still holds

	mu      sync.Mutex // done, woken (the SQ is the queue thread's alone)
	pending uint32
	done    []uint64 // entries answered by request goroutines
	woken   bool
	efd     int
	ebuf    *[8]byte
}

// startRings registers a queue per possible CPU (the kernel's requirement
// before it routes requests to them) and starts serving them. On an error
// it also returns the queues already serving, to be closed with the
// server.
func startRings(s *Server) (*rings, error) {
	n, err := possibleCPUs()
	if err != nil {
		return nil, err
	}
	r := &rings{}
	for id := range n {
		q, err := newQueue(s, id)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("queue %d: %w", id, err)
		}
		r.queues = append(r.queues, q)
	}
	started := &rings{}
	// Each queue's thread registers its entries itself: the kernel
	// completes a FUSE command through task work of the thread that
	// submitted it, so one thread must own each ring.
	for i, q := range r.queues {
		registered := make(chan error, 1)
		started.wg.Go(func() { q.serve(registered) })
		started.queues = append(started.queues, q)
		if err := <-registered; err != nil {
			for _, rest := range r.queues[i+1:] {
				rest.free() // never served
			}
			// started's queues wait for the connection's end; the caller
			// closes them with the server.
			return started, fmt.Errorf("queue %d: registering entries: %w", q.id, err)
		}
	}
	return started, nil
}

// close waits for the queues to end (the connection's end completes every
// entry) and frees them.
func (r *rings) close() {
	r.wg.Wait()
	for _, q := range r.queues {
		q.free()
	}
}

func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	last := strings.TrimSpace(string(b))
	if i := strings.LastIndexAny(last, "-,"); i >= 0 {
		last = last[i+1:]
	}
	n, err := strconv.Atoi(last)
	if err != nil {
		return 0, fmt.Errorf("/sys/devices/system/cpu/possible %q: %w", b, err)
	}
	return n + 1, nil
}

func newQueue(s *Server, id int) (*queue, error) {
	q := &queue{s: s, id: id, fd: -1, efd: -1, ebuf: new([8]byte)}
	if err := q.setup(2*entriesPerQueue + 2); err != nil {
		q.free()
		return nil, err
	}
	efd, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC, 0)
	if e != 0 {
		q.free()
		return nil, fmt.Errorf("eventfd: %w", e)
	}
	q.efd = int(efd)
	for range entriesPerQueue {
		mem, err := syscall.Mmap(-1, 0, 4096+s.maxWrite, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			q.free()
			return nil, fmt.Errorf("entry memory: %w", err)
		}
		e := &entry{mem: mem, hdr: mem[:ringHeaderSize], payload: mem[4096:]}
		iov := (*[2]syscall.Iovec)(unsafe.Pointer(&mem[512]))
		iov[0] = syscall.Iovec{Base: &e.hdr[0], Len: ringHeaderSize}
		iov[1] = syscall.Iovec{Base: &e.payload[0], Len: uint64(s.maxWrite)}
		q.ents = append(q.ents, e)
	}
	return q, nil
}

// setup creates the ring and maps it.
func (q *queue) setup(entries uint32) error {
	var p [120]byte // struct io_uring_params
	le.PutUint32(p[8:], setupSQE128)
	fd, _, e := syscall.Syscall(sysIOURingSetup, uintptr(entries), uintptr(unsafe.Pointer(&p[0])), 0)
	if e != 0 {
		return fmt.Errorf("io_uring_setup: %w", e)
	}
	q.fd = int(fd)
	sqOff, cqOff := p[40:80], p[80:120]
	sqEntries, cqEntries := le.Uint32(p[0:]), le.Uint32(p[4:])
	size := max(le.Uint32(sqOff[24:])+sqEntries*4, le.Uint32(cqOff[20:])+cqEntries*cqeSize)
	var err error
	if q.ringMem, err = syscall.Mmap(q.fd, offSQRing, int(size), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		return fmt.Errorf("mapping the rings: %w", err)
	}
	if q.sqeMem, err = syscall.Mmap(q.fd, offSQEs, int(sqEntries*sqeSize), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		return fmt.Errorf("mapping the SQEs: %w", err)
	}
	base := unsafe.Pointer(&q.ringMem[0])
	at := func(off []byte, i int) unsafe.Pointer { return unsafe.Add(base, le.Uint32(off[i:])) }
	q.sqTail, q.sqMask, q.sqArray = at(sqOff, 4), at(sqOff, 8), at(sqOff, 24)
	q.cqHead, q.cqTail, q.cqMask, q.cqes = at(cqOff, 0), at(cqOff, 4), at(cqOff, 8), at(cqOff, 20)
	q.sqeBase = unsafe.Pointer(&q.sqeMem[0])
	return nil
}

func u32(p unsafe.Pointer) *uint32 { return (*uint32)(p) }

// sqe returns the next SQE, zeroed; on the queue's thread.
func (q *queue) sqe() []byte {
	tail := atomic.LoadUint32(u32(q.sqTail))
	idx := tail & *u32(q.sqMask)
	b := unsafe.Slice((*byte)(unsafe.Add(q.sqeBase, uintptr(idx)*sqeSize)), sqeSize)
	clear(b)
	*u32(unsafe.Add(q.sqArray, uintptr(idx)*4)) = idx
	atomic.StoreUint32(u32(q.sqTail), tail+1)
	q.pending++
	return b
}

// command queues a FUSE ring command for entry i; on the queue's thread.
func (q *queue) command(cmd uint32, i, commitID uint64) {
	b := q.sqe()
	b[0] = opURingCmd
	le.PutUint32(b[4:], uint32(q.s.fd))
	le.PutUint32(b[8:], cmd)
	le.PutUint64(b[16:], uint64(uintptr(unsafe.Pointer(&q.ents[i].mem[512])))) // the iovecs
	le.PutUint32(b[24:], 2)
	le.PutUint64(b[32:], i)
	// struct fuse_uring_cmd_req in the command area (offset 48).
	le.PutUint64(b[56:], commitID)
	le.PutUint16(b[64:], uint16(q.id))
}

// armWake queues a read of the eventfd request goroutines write to; on
// the queue's thread.
func (q *queue) armWake() {
	b := q.sqe()
	b[0] = opReadFixedless
	le.PutUint32(b[4:], uint32(q.efd))
	le.PutUint64(b[16:], uint64(uintptr(unsafe.Pointer(&q.ebuf[0]))))
	le.PutUint32(b[24:], 8)
	le.PutUint64(b[32:], wakeTag)
}

// enter hands the pending SQEs to the kernel and, with wait, blocks until
// a completion is there; on the queue's thread.
func (q *queue) enter(wait bool) error {
	minComplete, flags := uintptr(0), uintptr(0)
	if wait {
		minComplete, flags = 1, enterGetEvents
	}
	for {
		n, _, e := syscall.Syscall6(sysIOURingEnter, uintptr(q.fd), uintptr(q.pending), minComplete, flags, 0, 0)
		if e == syscall.EINTR || e == syscall.EAGAIN {
			continue
		}
		if e != 0 {
			return fmt.Errorf("io_uring_enter: %w", e)
		}
		q.pending -= uint32(n)
		if q.pending == 0 {
			return nil
		}
	}
}

// serve registers the queue's entries, reports that on registered, then
// handles completions until every entry has come back with the
// connection's end. It keeps its OS thread: see startRings.
func (q *queue) serve(registered chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := range q.ents {
		q.command(cmdRegister, uint64(i), 0)
	}
	q.armWake()
	if err := q.enter(false); err != nil {
		registered <- err
		return
	}
	q.live = len(q.ents)
	registered <- nil
	for q.live > 0 {
		if err := q.enter(true); err != nil {
			q.s.log.WithError(err).Error("FUSE ring: waiting for completions failed")
			return
		}
		q.reap()
	}
}

// reap handles the completions there are.
func (q *queue) reap() {
	head := atomic.LoadUint32(u32(q.cqHead))
	tail := atomic.LoadUint32(u32(q.cqTail))
	for ; head != tail; head++ {
		c := unsafe.Slice((*byte)(unsafe.Add(q.cqes, uintptr(head&*u32(q.cqMask))*cqeSize)), cqeSize)
		tag, res := le.Uint64(c[0:]), int32(le.Uint32(c[8:]))
		switch {
		case tag == wakeTag:
			q.commitDone(res)
		case res < 0: // the connection ended (or the entry was refused)
			q.live--
			if res != errno(syscall.ENOTCONN) && res != errno(syscall.ECANCELED) && res != errno(syscall.ENODEV) {
				q.s.log.WithField("queue", q.id).WithError(syscall.Errno(-res)).Warn("FUSE ring: entry ended")
			}
		default:
			q.dispatch(tag)
		}
	}
	atomic.StoreUint32(u32(q.cqHead), head)
}

// dispatch serves the request in entry i: at once, or on a goroutine for
// what waits on the device.
func (q *queue) dispatch(i uint64) {
	e := q.ents[i]
	op := le.Uint32(e.hdr[4:])
	req := request{header: e.hdr[:inHeaderSize], in: e.hdr[ringOpIn : ringOpIn+inSize(op)],
		payload: e.payload[:min(int(le.Uint32(e.hdr[ringEntInOut+16:])), len(e.payload))]}
	if !blocks(op) {
		status, n := q.s.serve(req, e.payload)
		q.answer(e, req.unique(), status, n)
		q.command(cmdCommitAndFetch, i, le.Uint64(e.hdr[ringEntInOut+8:]))
		return
	}
	q.s.readers.Go(func() {
		status, n := q.s.serve(req, e.payload)
		q.answer(e, req.unique(), status, n)
		q.mu.Lock()
		q.done = append(q.done, i)
		wake := !q.woken
		q.woken = true
		q.mu.Unlock()
		if wake {
			var one [8]byte
			one[0] = 1
			_, _ = syscall.Write(q.efd, one[:])
		}
	})
}

// answer writes the reply's header into the entry.
func (q *queue) answer(e *entry, unique uint64, status int32, n int) {
	clear(e.hdr[:outHeaderSize])
	le.PutUint32(e.hdr[0:], uint32(outHeaderSize+n))
	le.PutUint32(e.hdr[4:], uint32(status))
	le.PutUint64(e.hdr[8:], unique)
	le.PutUint32(e.hdr[ringEntInOut+16:], uint32(n)) // payload_sz
}

// commitDone commits what request goroutines answered and re-arms the
// eventfd read (res is that read's result).
func (q *queue) commitDone(res int32) {
	q.mu.Lock()
	done := q.done
	q.done, q.woken = nil, false
	q.mu.Unlock()
	for _, i := range done {
		q.command(cmdCommitAndFetch, i, le.Uint64(q.ents[i].hdr[ringEntInOut+8:]))
	}
	if res >= 0 || !errors.Is(syscall.Errno(-res), syscall.ECANCELED) {
		q.armWake()
	}
}

// free releases the ring and the entries' memory.
func (q *queue) free() {
	if q.fd >= 0 {
		syscall.Close(q.fd)
	}
	if q.efd >= 0 {
		syscall.Close(q.efd)
	}
	for _, m := range [][]byte{q.ringMem, q.sqeMem} {
		if m != nil {
			_ = syscall.Munmap(m)
		}
	}
	for _, e := range q.ents {
		_ = syscall.Munmap(e.mem)
	}
}
