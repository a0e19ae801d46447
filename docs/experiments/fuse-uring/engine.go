//go:build ignore

package main

import (
	"context"
	"net"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicaserver"
	"github.com/strata-storage/strata/engine/replication"
)

// newEngine builds what an instance manager runs for a 1-replica volume:
// a replica served over dataconn on loopback, an engine dialing it.
func newEngine(dir string, size int64) (*replication.Engine, error) {
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	rep, err := replica.Create(dir, size, replica.CreateOptions{})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := dataconn.NewServer(replicaserver.New(rep, log), log)
	go srv.Serve(l)
	c, err := dataconn.Dial(context.Background(), l.Addr().String(), dataconn.Options{Log: log, Unencrypted: true})
	if err != nil {
		return nil, err
	}
	eng := replication.New("vol", size, log, nil)
	return eng, eng.AddReplica("r", l.Addr().String(), c, replication.ModeRW)
}

// engineIO runs a READ/WRITE on the engine in a goroutine and hands the
// finished entry to the ring thread through the eventfd.
func (s *server) engineIO(r *ring, e *entry, i uint64, op uint32, opIn []byte) {
	off := int64(le.Uint64(opIn[8:]))
	size := int(le.Uint32(opIn[16:]))
	go func() {
		var err error
		n := 0
		if op == opRead {
			_, err = s.eng.ReadAt(e.payload[:size], off)
			n = size
		} else {
			_, err = s.eng.WriteAt(e.payload[:size], off)
			clear(e.payload[:8])
			le.PutUint32(e.payload[0:], uint32(size))
			n = 8
		}
		errno := int32(0)
		if err != nil {
			errno, n = -int32(syscall.EIO), 0
		}
		unique := le.Uint64(e.hdr[8:])
		clear(e.hdr[:outHdrSize])
		le.PutUint32(e.hdr[0:], uint32(outHdrSize+n))
		le.PutUint32(e.hdr[4:], uint32(errno))
		le.PutUint64(e.hdr[8:], unique)
		le.PutUint32(e.hdr[256+16:], uint32(n))
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
	}()
}
