// Package inflight bounds the requests and payload bytes a server
// connection has in progress, so a client that pipelines deeply gets
// backpressure instead of unbounded memory. The NBD and dataconn servers
// share it. (A weighted semaphore bounds one quantity; this bounds two and
// admits an oversized request alone rather than never.)
package inflight

import "sync"

// Limiter bounds in-progress requests and bytes. The zero value is not
// usable; call New.
type Limiter struct {
	mu       sync.Mutex
	cond     sync.Cond
	ops      int
	bytes    int64
	maxOps   int
	maxBytes int64
}

// New returns a limiter of maxOps requests and maxBytes payload bytes.
func New(maxOps int, maxBytes int64) *Limiter {
	l := &Limiter{maxOps: maxOps, maxBytes: maxBytes}
	l.cond.L = &l.mu
	return l
}

// Acquire waits until a request of n bytes fits. One larger than maxBytes
// runs once no bytes are held.
func (l *Limiter) Acquire(n int64) {
	l.mu.Lock()
	for l.ops >= l.maxOps || (l.bytes > 0 && l.bytes+n > l.maxBytes) {
		l.cond.Wait()
	}
	l.ops++
	l.bytes += n
	l.mu.Unlock()
}

// Release returns what an Acquire of n bytes took.
func (l *Limiter) Release(n int64) {
	l.mu.Lock()
	l.ops--
	l.bytes -= n
	l.mu.Unlock()
	l.cond.Signal()
}
