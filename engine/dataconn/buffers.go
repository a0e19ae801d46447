package dataconn

import (
	"bufio"
	"io"
	"net"
	"sync"
)

// Payload buffers come from size-classed pools so steady-state I/O does not
// allocate a fresh buffer per request. The last class holds the largest
// payload, so no validated frame ever misses the pools.
var bufClasses = [...]int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, MaxPayload}

var bufPools [len(bufClasses)]sync.Pool

// getBuf returns a pooled buffer of length n (n <= MaxPayload). The pointer
// travels with the buffer so putBuf does not allocate.
func getBuf(n int) *[]byte {
	for i, c := range bufClasses {
		if n <= c {
			if p, ok := bufPools[i].Get().(*[]byte); ok {
				*p = (*p)[:n]
				return p
			}
			b := make([]byte, n, c)
			return &b
		}
	}
	b := make([]byte, n) // callers validate n first; kept for safety
	return &b
}

func putBuf(p *[]byte) {
	if p == nil {
		return
	}
	for i, c := range bufClasses {
		if cap(*p) == c {
			bufPools[i].Put(p)
			return
		}
	}
}

// inlinePayload is the size below which a payload is copied next to its
// header; larger payloads go out by reference so a 1 MiB WRITE or READ
// reply is never copied in user space.
const inlinePayload = 16 << 10

// maxScratch bounds the coalescing buffer kept between batches.
const maxScratch = 1 << 20

// frameWriter batches frames into one vectored write (writev on TCP):
// headers and small payloads are packed into a scratch buffer, large
// payloads are referenced. One flush per batch means one syscall for many
// pipelined frames.
type frameWriter struct {
	w io.Writer
	// bw coalesces the pieces when w cannot take them in one writev (a TLS
	// connection writes each piece as its own record otherwise).
	bw *bufio.Writer
	// gather, on a TLS connection, turns the records of one flush into
	// few system calls (recordConn).
	gather  gatherer
	scratch []byte
	mark    int // scratch[:mark] is already referenced by bufs
	bufs    net.Buffers
}

func newFrameWriter(w io.Writer) *frameWriter {
	fw := &frameWriter{w: w, scratch: make([]byte, 0, 64<<10)}
	if _, ok := w.(*net.TCPConn); !ok {
		fw.bw = bufio.NewWriterSize(w, 64<<10)
	}
	fw.gather, _ = w.(gatherer)
	return fw
}

func (fw *frameWriter) request(h RequestHeader, payload []byte) {
	fw.scratch = AppendRequestHeader(fw.scratch, h)
	fw.payload(payload)
}

func (fw *frameWriter) response(h ResponseHeader, payload []byte) {
	fw.scratch = AppendResponseHeader(fw.scratch, h)
	fw.payload(payload)
}

func (fw *frameWriter) payload(p []byte) {
	if len(p) < inlinePayload {
		// If append reallocates, slices already in bufs keep the old array,
		// which still holds their bytes unchanged.
		fw.scratch = append(fw.scratch, p...)
		return
	}
	fw.cut()
	fw.bufs = append(fw.bufs, p)
}

// cut moves the not-yet-referenced part of scratch into bufs.
func (fw *frameWriter) cut() {
	if len(fw.scratch) > fw.mark {
		fw.bufs = append(fw.bufs, fw.scratch[fw.mark:len(fw.scratch):len(fw.scratch)])
		fw.mark = len(fw.scratch)
	}
}

// flush writes everything added since the last flush.
func (fw *frameWriter) flush() error {
	fw.cut()
	var err error
	if len(fw.bufs) > 0 {
		if fw.bw != nil {
			if fw.gather != nil {
				fw.gather.hold()
			}
			for _, b := range fw.bufs {
				if _, err = fw.bw.Write(b); err != nil {
					break
				}
			}
			if err == nil {
				err = fw.bw.Flush()
			}
			if fw.gather != nil {
				if gerr := fw.gather.release(); err == nil {
					err = gerr
				}
			}
		} else {
			bufs := fw.bufs // WriteTo consumes its receiver; keep fw.bufs' array
			_, err = bufs.WriteTo(fw.w)
		}
	}
	clear(fw.bufs)
	fw.bufs = fw.bufs[:0]
	if cap(fw.scratch) > maxScratch {
		fw.scratch = make([]byte, 0, 64<<10)
	}
	fw.scratch = fw.scratch[:0]
	fw.mark = 0
	return err
}
