package dataconn

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

// testLog discards logs unless DATACONN_TEST_LOG is set, because several
// tests break connections on purpose.
func testLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	if os.Getenv("DATACONN_TEST_LOG") != "" {
		l.SetOutput(os.Stderr)
		l.SetLevel(logrus.DebugLevel)
	}
	return l
}

// testHandler is a Handler over any device with a pluggable Control.
type testHandler struct {
	blockdev.Device
	control func(ctx context.Context, method string, args json.RawMessage) (json.RawMessage, error)
}

func (h *testHandler) Control(ctx context.Context, method string, args json.RawMessage) (json.RawMessage, error) {
	if h.control == nil {
		return nil, ErrUnknownMethod
	}
	return h.control(ctx, method, args)
}

// startServer serves h on a loopback port; setup (may be nil) runs before
// Serve. The server is closed at cleanup.
func startServer(t testing.TB, h Handler, setup func(*Server), opts ...ServerOption) (*Server, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(h, testLog(), opts...)
	if setup != nil {
		setup(srv)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		require.ErrorIs(t, <-served, ErrServerClosed)
	})
	return srv, l.Addr().String()
}

func dial(t testing.TB, addr string, opts Options) *Client {
	t.Helper()
	if opts.Log == nil {
		opts.Log = testLog()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, opts)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// setHook installs the enqueue hook; it runs under the client's lock, in
// seq order.
func setHook(c *Client, hook func(*call)) {
	c.mu.Lock()
	c.testHookEnqueue = hook
	c.mu.Unlock()
}

// hangGuard bounds waits for something that must happen but, when broken,
// would never happen: far beyond any honest delay on a loaded machine, it
// turns a hang into a failure and says nothing about speed.
const hangGuard = time.Minute

// noHang runs fn and fails the test if it has not returned within
// hangGuard. fn must not call t's Fail methods (it runs on another
// goroutine); it records what to check afterwards.
func noHang(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatalf("%s: still blocked after %v", what, hangGuard)
	}
}

// checkGoroutines fails the test if goroutines started during it are still
// running at the end. Call it first, so its cleanup runs last.
func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutine leak: %d running, %d before the test\n%s", n, before, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// jitterDev delays every data operation by a random amount before doing
// it, so concurrent requests overlap and finish out of order on the server.
type jitterDev struct {
	blockdev.Device
	maxDelay time.Duration
}

func (d *jitterDev) sleep() {
	if d.maxDelay > 0 {
		time.Sleep(rand.N(d.maxDelay))
	}
}

func (d *jitterDev) ReadAt(p []byte, off int64) (int, error) {
	d.sleep()
	return d.Device.ReadAt(p, off)
}

func (d *jitterDev) WriteAt(p []byte, off int64) (int, error) {
	d.sleep()
	return d.Device.WriteAt(p, off)
}

func (d *jitterDev) Unmap(off, length int64) error {
	d.sleep()
	return d.Device.Unmap(off, length)
}

func (d *jitterDev) WriteZeroes(off, length int64) error {
	d.sleep()
	return d.Device.WriteZeroes(off, length)
}

// gateDev blocks WRITEs until the gate is opened, counting those waiting.
type gateDev struct {
	blockdev.Device
	gate    chan struct{}
	mu      sync.Mutex
	waiting int
	opened  sync.Once
}

// newGateDev returns a gated device. Register t.Cleanup(dev.open) after
// starting its server: cleanups run last first, so a failing test does not
// leave the server's Close waiting for device calls forever.
func newGateDev() *gateDev {
	return &gateDev{Device: blockdev.NewMem(1 << 20), gate: make(chan struct{})}
}

// open lets the waiting writes through; idempotent.
func (d *gateDev) open() { d.opened.Do(func() { close(d.gate) }) }

func (d *gateDev) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	d.waiting++
	d.mu.Unlock()
	<-d.gate
	return d.Device.WriteAt(p, off)
}

func (d *gateDev) waitingWrites() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiting
}

func pattern(seed byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}
