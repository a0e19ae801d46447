//go:build ignore

package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"syscall"
)

var be = binary.BigEndian

// nbdConn is one NBD connection to the export; requests are tagged with
// their ring entry; a reader goroutine commits each reply to the ring.
type nbdConn struct {
	c    net.Conn
	wmu  sync.Mutex
	ents []*entry
	hdr  [28]byte
}

func dialNBD(sock, export string) (*nbdConn, int64, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, 0, err
	}
	var b [18]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return nil, 0, err
	}
	if string(b[:8]) != "NBDMAGIC" || string(b[8:16]) != "IHAVEOPT" {
		return nil, 0, fmt.Errorf("not a newstyle NBD server")
	}
	var cf [4]byte
	be.PutUint32(cf[:], 1|2) // fixed newstyle, no zeroes
	c.Write(cf[:])
	opt := make([]byte, 16, 64)
	copy(opt, "IHAVEOPT")
	be.PutUint32(opt[8:], 7) // NBD_OPT_GO
	data := be.AppendUint32(nil, uint32(len(export)))
	data = append(data, export...)
	data = be.AppendUint16(data, 0)
	be.PutUint32(opt[12:], uint32(len(data)))
	c.Write(append(opt, data...))
	var size int64
	for {
		var rh [20]byte
		if _, err := io.ReadFull(c, rh[:]); err != nil {
			return nil, 0, err
		}
		typ, n := be.Uint32(rh[12:]), be.Uint32(rh[16:])
		d := make([]byte, n)
		if _, err := io.ReadFull(c, d); err != nil {
			return nil, 0, err
		}
		if typ&(1<<31) != 0 {
			return nil, 0, fmt.Errorf("NBD_OPT_GO refused: %d %s", typ, d)
		}
		if typ == 3 && be.Uint16(d) == 0 { // NBD_REP_INFO, NBD_INFO_EXPORT
			size = int64(be.Uint64(d[2:]))
		}
		if typ == 1 { // ACK
			break
		}
	}
	return &nbdConn{c: c}, size, nil
}

// send issues the FUSE READ/WRITE of entry i as an NBD request.
func (n *nbdConn) send(op uint32, opIn []byte, e *entry, i uint64, r *ring, qid int) {
	off := le.Uint64(opIn[8:])
	size := le.Uint32(opIn[16:])
	var req [28]byte
	be.PutUint32(req[0:], 0x25609513)
	typ := uint16(0)
	if op == opWrite {
		typ = 1
	}
	be.PutUint16(req[6:], typ)
	be.PutUint64(req[8:], i<<1|uint64(typ)) // cookie: entry and kind
	be.PutUint64(req[16:], off)
	be.PutUint32(req[24:], size)
	// Remember the size for the reply (the op_in area is ours until commit).
	le.PutUint32(e.hdr[256+28:], size) // ring_ent_in_out.padding... reserved scratch
	n.wmu.Lock()
	var err error
	if op == opWrite {
		bufs := net.Buffers{req[:], e.payload[:size]}
		_, err = bufs.WriteTo(n.c)
	} else {
		_, err = n.c.Write(req[:])
	}
	n.wmu.Unlock()
	if err != nil {
		log.Fatalf("nbd send: %v", err)
	}
}

// replies reads replies and commits them to the ring.
func (n *nbdConn) replies(s *server, r *ring, qid int) {
	var h [16]byte
	for {
		if _, err := io.ReadFull(n.c, h[:]); err != nil {
			log.Fatalf("nbd reply: %v", err)
		}
		if be.Uint32(h[0:]) != 0x67446698 {
			log.Fatalf("nbd: structured reply not expected")
		}
		nerr := be.Uint32(h[4:])
		cookie := be.Uint64(h[8:])
		i, isWrite := cookie>>1, cookie&1 == 1
		e := n.ents[i]
		size := le.Uint32(e.hdr[256+28:])
		var rn int
		errno := int32(0)
		if nerr != 0 {
			errno = -int32(syscall.EIO)
		} else if isWrite {
			clear(e.payload[:8])
			le.PutUint32(e.payload[0:], size)
			rn = 8
		} else {
			if _, err := io.ReadFull(n.c, e.payload[:size]); err != nil {
				log.Fatalf("nbd read data: %v", err)
			}
			rn = int(size)
		}
		commit := le.Uint64(e.hdr[256+8:])
		unique := le.Uint64(e.hdr[8:])
		clear(e.hdr[:outHdrSize])
		le.PutUint32(e.hdr[0:], uint32(outHdrSize+rn))
		le.PutUint32(e.hdr[4:], uint32(errno))
		le.PutUint64(e.hdr[8:], unique)
		le.PutUint32(e.hdr[256+16:], uint32(rn))
		_ = commit
		r.mu.Lock()
		r.done = append(r.done, i)
		wake := !r.woken
		r.woken = true
		r.mu.Unlock()
		if wake {
			var one [8]byte
			one[0] = 1
			syscall.Write(r.efd, one[:])
		}
	}
}
