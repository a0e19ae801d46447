package nbd

import (
	"math/bits"
	"sync"
)

// Payload buffers come from power-of-two size classes from 4 KiB to
// MaxPayload, so steady-state I/O allocates nothing.
const (
	minClassShift = 12 // 4 KiB
	maxClassShift = 25 // 32 MiB == MaxPayload
)

var bufPools [maxClassShift - minClassShift + 1]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuf returns a buffer of length n (0 < n <= MaxPayload).
func getBuf(n int) *[]byte {
	c := classOf(n)
	if v := bufPools[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(c+minClassShift))
	return &b
}

// putBuf returns a buffer obtained from getBuf.
func putBuf(b *[]byte) {
	if b == nil {
		return
	}
	c := classOf(cap(*b))
	if cap(*b) != 1<<(c+minClassShift) {
		return // not one of ours
	}
	bufPools[c].Put(b)
}

// zeroBuf is a read-only buffer of zeros used to write zeros explicitly.
var zeroBuf = sync.OnceValue(func() []byte { return make([]byte, 1<<20) })
