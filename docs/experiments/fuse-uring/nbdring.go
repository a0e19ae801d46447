//go:build ignore

package main

import (
	"log"
	"syscall"
	"unsafe"
)

const recvTag = 1 << 62

// ringNBD is one queue's NBD connection driven from the queue's own ring
// thread: requests written with writev, replies received by io_uring RECV,
// so no other goroutine or thread is in the request's path.
type ringNBD struct {
	fd     int
	ents   []*entry
	hdr    [16]byte
	got    int
	cur    uint64 // entry receiving read data
	inData bool
	need   int
	reqs   [][28]byte // per entry request header (stable memory)
	sizes  []uint32
}

func (n *ringNBD) send(op uint32, opIn []byte, i uint64) {
	e := n.ents[i]
	off, size := le.Uint64(opIn[8:]), le.Uint32(opIn[16:])
	req := &n.reqs[i]
	be.PutUint32(req[0:], 0x25609513)
	typ := uint16(0)
	if op == opWrite {
		typ = 1
	}
	be.PutUint16(req[4:], 0)
	be.PutUint16(req[6:], typ)
	be.PutUint64(req[8:], i<<1|uint64(typ))
	be.PutUint64(req[16:], off)
	be.PutUint32(req[24:], size)
	n.sizes[i] = size
	iov := []syscall.Iovec{{Base: &req[0], Len: 28}}
	if op == opWrite {
		iov = append(iov, syscall.Iovec{Base: &e.payload[0], Len: uint64(size)})
	}
	total := 28
	if op == opWrite {
		total += int(size)
	}
	for total > 0 {
		w, _, errno := syscall.Syscall(syscall.SYS_WRITEV, uintptr(n.fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			log.Fatalf("nbd writev: %v", errno)
		}
		total -= int(w)
		// advance iov by w
		for w > 0 && len(iov) > 0 {
			if uint64(w) >= iov[0].Len {
				w -= uintptr(iov[0].Len)
				iov = iov[1:]
			} else {
				iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(iov[0].Base), w))
				iov[0].Len -= uint64(w)
				w = 0
			}
		}
	}
}

func (n *ringNBD) armRecv(r *ring) {
	sqe := r.sqe()
	sqe[0] = 27 // IORING_OP_RECV
	le.PutUint32(sqe[4:], uint32(n.fd))
	var p unsafe.Pointer
	var l int
	if n.inData {
		p, l = unsafe.Pointer(&n.ents[n.cur].payload[n.got]), n.need-n.got
	} else {
		p, l = unsafe.Pointer(&n.hdr[n.got]), 16-n.got
	}
	le.PutUint64(sqe[16:], uint64(uintptr(p)))
	le.PutUint32(sqe[24:], uint32(l))
	le.PutUint64(sqe[32:], recvTag)
}

// received handles a RECV completion of res bytes; it returns the entry
// whose reply is complete, if one is.
func (n *ringNBD) received(res int) (uint64, int32, int, bool) {
	n.got += res
	if !n.inData {
		if n.got < 16 {
			return 0, 0, 0, false
		}
		n.got = 0
		if be.Uint32(n.hdr[0:]) != 0x67446698 {
			log.Fatalf("nbd: bad reply magic")
		}
		cookie := be.Uint64(n.hdr[8:])
		i, isWrite := cookie>>1, cookie&1 == 1
		if be.Uint32(n.hdr[4:]) != 0 {
			return i, -int32(syscall.EIO), 0, true
		}
		if isWrite {
			e := n.ents[i]
			clear(e.payload[:8])
			le.PutUint32(e.payload[0:], n.sizes[i])
			return i, 0, 8, true
		}
		n.inData, n.cur, n.need = true, i, int(n.sizes[i])
		if n.need > 0 {
			return 0, 0, 0, false
		}
	}
	if n.got < n.need {
		return 0, 0, 0, false
	}
	n.inData, n.got = false, 0
	return n.cur, 0, n.need, true
}
