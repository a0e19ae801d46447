//go:build ignore

// Prototype: a one-file FUSE server over FUSE-over-io_uring (kernel 6.14+),
// serving a backing file with pread/pwrite, to measure the ceiling.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/strata-storage/strata/engine/replication"
)

const (
	opLookup, opForget, opGetattr, opOpen, opRead, opWrite = 1, 2, 3, 14, 15, 16
	opStatfs, opRelease, opFsync, opGetxattr, opFlush      = 17, 18, 20, 22, 25
	opInit, opOpendir, opReaddir, opReleasedir, opAccess   = 26, 27, 28, 29, 34
	opInterrupt, opDestroy, opBatchForget                  = 36, 38, 42

	maxWrite   = 1 << 20
	inHdrSize  = 40
	outHdrSize = 16
)

var le = binary.LittleEndian

var classicN, ringN atomic.Int64

var keep []any // files whose descriptors the rings use

var pin = flag.Bool("pin", false, "pin each queue's thread to its CPU")

type server struct {
	nbd     []*nbdConn
	eng     *replication.Engine
	rnbd    []*ringNBD
	fd      int
	backing *os.File
	size    int64
}

// opSize is the fixed in-struct (in_args[0]) of each opcode we serve.
func opSize(op uint32) int {
	switch op {
	case opGetattr:
		return 16
	case opOpen, opOpendir, opAccess, opGetxattr, opForget, opInterrupt, opBatchForget:
		return 8
	case opRead, opWrite, opReaddir:
		return 40
	case opFlush, opRelease, opReleasedir:
		return 24
	case opFsync:
		return 16
	case opInit:
		return 64
	}
	return 0
}

func attr(b []byte, nodeid uint64, size int64) {
	le.PutUint64(b[0:], nodeid) // ino
	le.PutUint64(b[8:], uint64(size))
	le.PutUint64(b[16:], uint64(size/512))
	mode := uint32(syscall.S_IFDIR | 0o755)
	nlink := uint32(2)
	if nodeid == 2 {
		mode, nlink = syscall.S_IFREG|0o600, 1
	}
	le.PutUint32(b[60:], mode)
	le.PutUint32(b[64:], nlink)
	le.PutUint32(b[80:], 4096) // blksize
}

// handle serves one request; out receives the reply's args. It returns the
// errno (0 for success), the reply length, and whether to reply at all.
func (s *server) handle(hdr, opIn, payload, out []byte) (errno int32, n int, reply bool) {
	op := le.Uint32(hdr[4:])
	nodeid := le.Uint64(hdr[16:])
	switch op {
	case opForget, opBatchForget:
		return 0, 0, false
	case opLookup:
		name := string(payload)
		if i := indexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if nodeid != 1 || name != "disk" {
			return -int32(syscall.ENOENT), 0, true
		}
		clear(out[:128])
		le.PutUint64(out[0:], 2)
		le.PutUint64(out[16:], 3600)
		le.PutUint64(out[24:], 3600)
		attr(out[40:], 2, s.size)
		return 0, 128, true
	case opGetattr:
		clear(out[:104])
		le.PutUint64(out[0:], 3600)
		sz := s.size
		if nodeid == 1 {
			sz = 0
		}
		attr(out[16:], nodeid, sz)
		return 0, 104, true
	case opOpen, opOpendir:
		clear(out[:16])
		if op == opOpen {
			le.PutUint32(out[8:], 1|1<<6) // FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES
		}
		return 0, 16, true
	case opRead:
		off := int64(le.Uint64(opIn[8:]))
		size := int(le.Uint32(opIn[16:]))
		got, err := s.backing.ReadAt(out[:size], off)
		if err != nil && got == 0 && off < s.size {
			return -int32(syscall.EIO), 0, true
		}
		return 0, got, true
	case opWrite:
		off := int64(le.Uint64(opIn[8:]))
		size := int(le.Uint32(opIn[16:]))
		if _, err := s.backing.WriteAt(payload[:size], off); err != nil {
			return -int32(syscall.EIO), 0, true
		}
		clear(out[:8])
		le.PutUint32(out[0:], uint32(size))
		return 0, 8, true
	case opFlush, opRelease, opReleasedir, opFsync, opAccess:
		return 0, 0, true
	case opReaddir:
		return 0, 0, true // empty listing: the prototype is opened by path
	case opStatfs:
		clear(out[:80])
		return 0, 80, true
	case opDestroy:
		return 0, 0, true
	}
	return -int32(syscall.ENOSYS), 0, true
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// classic serves /dev/fuse by read/write: INIT, and what comes before the
// ring is ready (and FORGETs, which never use the ring).
func (s *server) classic(ringUp func()) {
	buf := make([]byte, maxWrite+4096)
	out := make([]byte, maxWrite+outHdrSize)
	for {
		n, err := syscall.Read(s.fd, buf)
		if err == syscall.EINTR || err == syscall.EAGAIN {
			continue
		}
		if err != nil {
			if err == syscall.ENODEV {
				os.Exit(0)
			}
			log.Fatalf("read /dev/fuse: %v", err)
		}
		hdr := buf[:inHdrSize]
		op := le.Uint32(hdr[4:])
		body := buf[inHdrSize:n]
		if op == opInit {
			s.init(hdr, body, out)
			go ringUp()
			continue
		}
		classicN.Add(1)
		sz := min(opSize(op), len(body))
		errno, rn, reply := s.handle(hdr, body[:sz], body[sz:], out[outHdrSize:])
		if !reply {
			continue
		}
		le.PutUint32(out[0:], uint32(outHdrSize+rn))
		le.PutUint32(out[4:], uint32(errno))
		le.PutUint64(out[8:], le.Uint64(hdr[8:]))
		if _, err := syscall.Write(s.fd, out[:outHdrSize+rn]); err != nil && err != syscall.ENOENT {
			log.Printf("reply to op %d: %v", op, err)
		}
	}
}

func (s *server) init(hdr, in, out []byte) {
	major, minor := le.Uint32(in[0:]), le.Uint32(in[4:])
	flags := uint64(le.Uint32(in[12:])) | uint64(le.Uint32(in[16:]))<<32
	log.Printf("INIT from kernel %d.%d flags %#x (io_uring offered: %v)", major, minor, flags, flags&(1<<41) != 0)
	const (
		asyncRead, bigWrites, asyncDIO, maxPages, initExt, overIOUring = 1 << 0, 1 << 5, 1 << 15, 1 << 22, 1 << 30, 1 << 41
	)
	want := uint64(asyncRead | bigWrites | maxPages | initExt | overIOUring | asyncDIO)
	o := out[outHdrSize : outHdrSize+64]
	clear(o)
	le.PutUint32(o[0:], 7)
	le.PutUint32(o[4:], minor)
	le.PutUint32(o[8:], 128<<10)
	le.PutUint32(o[12:], uint32(want&flags))
	le.PutUint16(o[16:], 64) // max_background
	le.PutUint16(o[18:], 48)
	le.PutUint32(o[20:], maxWrite)
	le.PutUint32(o[24:], 1)                        // time_gran
	le.PutUint16(o[28:], maxWrite/4096)            // max_pages
	le.PutUint32(o[32:], uint32((want&flags)>>32)) // flags2
	le.PutUint32(out[0:], outHdrSize+64)
	le.PutUint32(out[4:], 0)
	le.PutUint64(out[8:], le.Uint64(hdr[8:]))
	if _, err := syscall.Write(s.fd, out[:outHdrSize+64]); err != nil {
		log.Fatalf("INIT reply: %v", err)
	}
}

// ---- io_uring ----

type ring struct {
	mu                              sync.Mutex
	done                            []uint64 // entries whose NBD reply is in, to commit
	woken                           bool
	efd                             int
	ebuf                            [8]byte
	fd                              int
	sqHead, sqTail, sqMask, sqArray unsafe.Pointer
	cqHead, cqTail, cqMask          unsafe.Pointer
	cqes, sqes                      unsafe.Pointer
	sqEntries                       uint32
	pending                         uint32
}

func u32(p unsafe.Pointer) *uint32 { return (*uint32)(p) }

func newRing(entries uint32) (*ring, error) {
	var p [120]byte
	le.PutUint32(p[8:], 1<<10) // IORING_SETUP_SQE128
	fd, _, e := syscall.Syscall(425, uintptr(entries), uintptr(unsafe.Pointer(&p[0])), 0)
	if e != 0 {
		return nil, fmt.Errorf("io_uring_setup: %v", e)
	}
	sqOff, cqOff := p[40:80], p[80:120]
	sqEntries, cqEntries := le.Uint32(p[0:]), le.Uint32(p[4:])
	sqSize := le.Uint32(sqOff[24:]) + sqEntries*4
	cqSize := le.Uint32(cqOff[20:]) + cqEntries*16
	size := max(sqSize, cqSize)
	ringMem, err := syscall.Mmap(int(fd), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap ring: %v", err)
	}
	sqeMem, err := syscall.Mmap(int(fd), 0x10000000, int(sqEntries*128), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap sqes: %v", err)
	}
	base := unsafe.Pointer(&ringMem[0])
	at := func(off []byte, i int) unsafe.Pointer { return unsafe.Add(base, le.Uint32(off[i:])) }
	return &ring{fd: int(fd), sqHead: at(sqOff, 0), sqTail: at(sqOff, 4), sqMask: at(sqOff, 8), sqArray: at(sqOff, 24),
		cqHead: at(cqOff, 0), cqTail: at(cqOff, 4), cqMask: at(cqOff, 8), cqes: at(cqOff, 20),
		sqes: unsafe.Pointer(&sqeMem[0]), sqEntries: sqEntries}, nil
}

// sqe returns the next free 128-byte SQE, zeroed.
func (r *ring) sqe() []byte {
	tail := atomic.LoadUint32(u32(r.sqTail))
	idx := tail & *u32(r.sqMask)
	b := unsafe.Slice((*byte)(unsafe.Add(r.sqes, idx*128)), 128)
	clear(b)
	*u32(unsafe.Add(r.sqArray, idx*4)) = idx
	atomic.StoreUint32(u32(r.sqTail), tail+1)
	r.pending++
	return b
}

const wakeTag = 1 << 63

// armWake queues a read of the eventfd the NBD reply reader writes to.
func (r *ring) armWake() {
	sqe := r.sqe()
	sqe[0] = 22 // IORING_OP_READ
	le.PutUint32(sqe[4:], uint32(r.efd))
	le.PutUint64(sqe[16:], uint64(uintptr(unsafe.Pointer(&r.ebuf[0]))))
	le.PutUint32(sqe[24:], 8)
	le.PutUint64(sqe[32:], wakeTag)
}

// submit hands the pending SQEs to the kernel; r.mu held.
func (r *ring) submit() error {
	for r.pending > 0 {
		n, _, e := syscall.Syscall6(426, uintptr(r.fd), uintptr(r.pending), 0, 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		r.pending -= uint32(n)
	}
	return nil
}

// wait blocks for at least one completion, submitting nothing.
func (r *ring) wait() error {
	for {
		_, _, e := syscall.Syscall6(426, uintptr(r.fd), 0, 1, 1 /* GETEVENTS */, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

func (r *ring) enter(wait uint32) error {
	for {
		_, _, e := syscall.Syscall6(426, uintptr(r.fd), uintptr(r.pending), uintptr(wait), 1 /* GETEVENTS */, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		r.pending = 0
		if e != 0 {
			return e
		}
		return nil
	}
}

// ---- FUSE queues on the ring ----

const entriesPerQueue = 64

type entry struct {
	hdr     []byte // 288 bytes: in_out[128] op_in[128] ring_ent_in_out[32]
	payload []byte
	iov     []syscall.Iovec
}

func (s *server) serveQueue(qid int, ready chan<- error) {
	runtime.LockOSThread()
	if *pin {
		var set [16]uint64
		set[qid/64] |= 1 << (qid % 64)
		if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, uintptr(len(set)*8), uintptr(unsafe.Pointer(&set[0]))); e != 0 {
			log.Printf("affinity: %v", e)
		}
	}
	r, err := newRing(2 * entriesPerQueue)
	if err != nil {
		ready <- err
		return
	}
	ents := make([]*entry, entriesPerQueue)
	for i := range ents {
		mem, err := syscall.Mmap(-1, 0, 4096+maxWrite, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
		if err != nil {
			ready <- err
			return
		}
		e := &entry{hdr: mem[:288], payload: mem[4096:]}
		e.iov = []syscall.Iovec{{Base: &e.hdr[0], Len: 288}, {Base: &e.payload[0], Len: maxWrite}}
		ents[i] = e
		s.cmd(r.sqe(), 1 /* REGISTER */, qid, 0, e, uint64(i))
	}
	if err := r.enter(0); err != nil {
		ready <- fmt.Errorf("register queue %d: %v", qid, err)
		return
	}
	if s.rnbd != nil {
		n := s.rnbd[qid]
		n.ents, n.reqs, n.sizes = ents, make([][28]byte, len(ents)), make([]uint32, len(ents))
		n.armRecv(r)
		if err := r.submit(); err != nil {
			ready <- err
			return
		}
	}
	if s.eng != nil {
		efd, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC, 0)
		if e != 0 {
			ready <- e
			return
		}
		r.efd = int(efd)
		r.mu.Lock()
		r.armWake()
		r.mu.Unlock()
	}
	if s.nbd != nil {
		s.nbd[qid].ents = ents
		efd, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC, 0)
		if e != 0 {
			ready <- e
			return
		}
		r.efd = int(efd)
		r.armWake()
		go s.nbd[qid].replies(s, r, qid)
	}
	ready <- nil
	out := make([]byte, maxWrite)
	_ = out
	for {
		if err := r.wait(); err != nil {
			log.Fatalf("queue %d enter: %v", qid, err)
		}
		head := atomic.LoadUint32(u32(r.cqHead))
		tail := atomic.LoadUint32(u32(r.cqTail))
		for ; head != tail; head++ {
			c := unsafe.Slice((*byte)(unsafe.Add(r.cqes, (head&*u32(r.cqMask))*16)), 16)
			i, res := le.Uint64(c[0:]), int32(le.Uint32(c[8:]))
			if i == recvTag {
				n := s.rnbd[qid]
				if res <= 0 {
					log.Fatalf("nbd recv: %d", res)
				}
				if j, errno, rn, ok := n.received(int(res)); ok {
					e := ents[j]
					commit, unique := le.Uint64(e.hdr[256+8:]), le.Uint64(e.hdr[8:])
					clear(e.hdr[:outHdrSize])
					le.PutUint32(e.hdr[0:], uint32(outHdrSize+rn))
					le.PutUint32(e.hdr[4:], uint32(errno))
					le.PutUint64(e.hdr[8:], unique)
					le.PutUint32(e.hdr[256+16:], uint32(rn))
					r.mu.Lock()
					s.cmd(r.sqe(), 2, qid, commit, e, j)
					r.mu.Unlock()
				}
				r.mu.Lock()
				n.armRecv(r)
				r.mu.Unlock()
				continue
			}
			if i == wakeTag {
				r.mu.Lock()
				done := r.done
				r.done, r.woken = nil, false
				for _, j := range done {
					e := ents[j]
					s.cmd(r.sqe(), 2, qid, le.Uint64(e.hdr[256+8:]), e, j)
				}
				r.armWake()
				r.mu.Unlock()
				continue
			}
			if res < 0 {
				if res == -int32(syscall.ENOTCONN) || res == -int32(syscall.ENODEV) {
					os.Exit(0)
				}
				log.Fatalf("queue %d entry %d: CQE error %v", qid, i, syscall.Errno(-res))
			}
			e := ents[i]
			ringN.Add(1)
			hdr := e.hdr[:inHdrSize]
			op := le.Uint32(hdr[4:])
			psz := le.Uint32(e.hdr[256+16:])
			opIn := e.hdr[128 : 128+opSize(op)]
			commit := le.Uint64(e.hdr[256+8:])
			if s.eng != nil && (op == opRead || op == opWrite) {
				s.engineIO(r, e, i, op, opIn)
				continue
			}
			if s.rnbd != nil && (op == opRead || op == opWrite) {
				s.rnbd[qid].send(op, opIn, i)
				continue
			}
			if s.nbd != nil && (op == opRead || op == opWrite) {
				s.nbd[qid].send(op, opIn, e, i, r, qid)
				continue
			}
			// The reply's args go to the payload buffer; READ reads straight into it.
			errno, n, _ := s.handle(hdr, opIn, e.payload[:psz], e.payload)
			unique := le.Uint64(hdr[8:])
			clear(e.hdr[:outHdrSize])
			le.PutUint32(e.hdr[0:], uint32(outHdrSize+n))
			le.PutUint32(e.hdr[4:], uint32(errno))
			le.PutUint64(e.hdr[8:], unique)
			le.PutUint32(e.hdr[256+16:], uint32(n))
			r.mu.Lock()
			s.cmd(r.sqe(), 2 /* COMMIT_AND_FETCH */, qid, commit, e, i)
			r.mu.Unlock()
		}
		atomic.StoreUint32(u32(r.cqHead), head)
		r.mu.Lock()
		err := r.submit()
		r.mu.Unlock()
		if err != nil {
			log.Fatalf("submit: %v", err)
		}
	}
}

// cmd fills an IORING_OP_URING_CMD SQE for /dev/fuse.
func (s *server) cmd(sqe []byte, cmdOp uint32, qid int, commit uint64, e *entry, userData uint64) {
	sqe[0] = 46 // IORING_OP_URING_CMD
	le.PutUint32(sqe[4:], uint32(s.fd))
	le.PutUint32(sqe[8:], cmdOp)
	le.PutUint64(sqe[16:], uint64(uintptr(unsafe.Pointer(&e.iov[0]))))
	le.PutUint32(sqe[24:], 2)
	le.PutUint64(sqe[32:], userData)
	// struct fuse_uring_cmd_req at the command area (offset 48)
	le.PutUint64(sqe[48:], 0)
	le.PutUint64(sqe[56:], commit)
	le.PutUint16(sqe[64:], uint16(qid))
}

func main() {
	backing := flag.String("backing", "", "")
	mnt := flag.String("mnt", "", "")
	useRing := flag.Bool("ring", true, "")
	nbdSock := flag.String("nbd-socket", "", "serve this NBD export instead of -backing")
	nbdExport := flag.String("nbd-export", "", "")
	engDir := flag.String("engine-dir", "", "serve a 1-replica engine with its replica in this directory")
	ringRecv := flag.Bool("ring-recv", true, "drive the NBD connection from the ring thread")
	flag.Parse()
	f, err := os.OpenFile(*backing, os.O_RDWR, 0)
	if err != nil {
		log.Fatal(err)
	}
	st, _ := f.Stat()
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		log.Fatal(err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", fd)
	if err := syscall.Mount("uringproto", *mnt, "fuse.uringproto", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
		log.Fatalf("mount: %v", err)
	}
	s := &server{fd: fd, backing: f, size: st.Size()}
	if *engDir != "" {
		eng, err := newEngine(*engDir, st.Size())
		if err != nil {
			log.Fatal(err)
		}
		s.eng = eng
		buf := make([]byte, 1<<20)
		for off := int64(0); off < st.Size(); off += 1 << 20 {
			f.ReadAt(buf, off)
			eng.WriteAt(buf, off)
		}
	}
	if *nbdSock != "" && *ringRecv {
		for range runtime.NumCPU() {
			c, size, err := dialNBD(*nbdSock, *nbdExport)
			if err != nil {
				log.Fatalf("nbd: %v", err)
			}
			f, err := c.c.(*net.UnixConn).File()
			if err != nil {
				log.Fatal(err)
			}
			syscall.SetNonblock(int(f.Fd()), false)
			keep = append(keep, f, c.c)
			s.rnbd, s.size = append(s.rnbd, &ringNBD{fd: int(f.Fd())}), size
		}
	} else if *nbdSock != "" {
		for range runtime.NumCPU() {
			c, size, err := dialNBD(*nbdSock, *nbdExport)
			if err != nil {
				log.Fatalf("nbd: %v", err)
			}
			s.nbd, s.size = append(s.nbd, c), size
		}
	}
	ringUp := func() {
		if !*useRing {
			return
		}
		for q := 0; q < runtime.NumCPU(); q++ {
			ready := make(chan error, 1)
			go s.serveQueue(q, ready)
			if err := <-ready; err != nil {
				log.Fatalf("ring: %v", err)
			}
		}
		log.Printf("FUSE over io_uring: %d queues of %d entries registered", runtime.NumCPU(), entriesPerQueue)
	}
	for range 2 { // classic readers for INIT, early requests, FORGETs
		go s.classic(ringUp)
	}
	for {
		time.Sleep(5 * time.Second)
		log.Printf("requests: classic %d ring %d", classicN.Load(), ringN.Load())
	}
}
