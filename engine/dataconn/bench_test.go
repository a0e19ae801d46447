package dataconn

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/strata-storage/strata/engine/blockdev"
)

// BenchmarkClient measures the protocol over loopback TCP against an
// in-memory device, so the figures are the data path's own overhead: plain
// TCP as the baseline and mutual TLS (what instance managers use), in the
// same run.
func BenchmarkClient(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchClient(b, false, false) })
	b.Run("tls", func(b *testing.B) { benchClient(b, true, false) })
	b.Run("tls-auth-only", func(b *testing.B) { benchClient(b, true, true) })
}

func benchClient(b *testing.B, withTLS, unencrypted bool) {
	const size = 256 << 20
	var srvOpts []ServerOption
	var opts Options
	if withTLS {
		server, client := testTLS(b)
		srvOpts, opts.TLS, opts.Unencrypted = []ServerOption{WithTLS(server)}, client, unencrypted
	}
	_, addr := startServer(b, &testHandler{Device: blockdev.NewMem(size)}, nil, srvOpts...)
	c := dial(b, addr, opts)

	// seq: each goroutine takes the next chunk of the device in turn.
	seq := func(n int, write bool) func(b *testing.B) {
		return func(b *testing.B) {
			var next atomic.Int64
			b.SetBytes(int64(n))
			b.RunParallel(func(pb *testing.PB) {
				p := make([]byte, n)
				for pb.Next() {
					off := (next.Add(1) * int64(n)) % size
					var err error
					if write {
						_, err = c.WriteAt(p, off)
					} else {
						_, err = c.ReadAt(p, off)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
	}
	random := func(n int, write bool) func(b *testing.B) {
		return func(b *testing.B) {
			b.SetBytes(int64(n))
			b.RunParallel(func(pb *testing.PB) {
				p := make([]byte, n)
				for pb.Next() {
					off := rand.Int64N(size/int64(n)) * int64(n)
					var err error
					if write {
						_, err = c.WriteAt(p, off)
					} else {
						_, err = c.ReadAt(p, off)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
	}
	qd1 := func(b *testing.B) {
		b.SetBytes(4096)
		p := make([]byte, 4096)
		for b.Loop() {
			if _, err := c.ReadAt(p, rand.Int64N(size/4096)*4096); err != nil {
				b.Fatal(err)
			}
		}
	}
	ping := func(b *testing.B) {
		for b.Loop() {
			if err := c.Ping(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}

	// RunParallel runs GOMAXPROCS*parallelism goroutines.
	parallel := func(p int, fn func(b *testing.B)) func(b *testing.B) {
		return func(b *testing.B) {
			b.SetParallelism(p)
			fn(b)
		}
	}
	b.Run("seq-write-1MiB", parallel(4, seq(1<<20, true)))
	b.Run("seq-read-1MiB", parallel(4, seq(1<<20, false)))
	b.Run("rand-read-4KiB", parallel(16, random(4096, false)))
	b.Run("rand-write-4KiB", parallel(16, random(4096, true)))
	b.Run("rand-read-4KiB-qd1", qd1)
	b.Run("ping", ping)
}
