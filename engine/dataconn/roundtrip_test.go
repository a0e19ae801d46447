package dataconn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

const devSize = 40 << 20 // above MaxIOSize, so split I/O can be tested

func TestRoundTrip(t *testing.T) {
	checkGoroutines(t)
	mem := blockdev.NewMem(devSize)
	_, addr := startServer(t, &testHandler{Device: mem}, nil)
	c := dial(t, addr, Options{Timeout: 10 * time.Second})

	readBack := func(t *testing.T, off int64, n int) []byte {
		t.Helper()
		p := make([]byte, n)
		got, err := c.ReadAt(p, off)
		require.NoError(t, err)
		require.Equal(t, n, got)
		return p
	}
	writeRead := func(off int64, n int) func(t *testing.T) {
		return func(t *testing.T) {
			data := pattern(byte(off), n)
			got, err := c.WriteAt(data, off)
			require.NoError(t, err)
			require.Equal(t, n, got)
			require.True(t, bytes.Equal(data, readBack(t, off, n)), "read back differs")
			direct := make([]byte, n)
			_, err = mem.ReadAt(direct, off)
			require.NoError(t, err)
			require.True(t, bytes.Equal(data, direct), "device content differs")
		}
	}
	outOfRange := func(fn func() error) func(t *testing.T) {
		return func(t *testing.T) {
			err := fn()
			require.Error(t, err)
			assert.ErrorIs(t, err, blockdev.ErrOutOfRange)
			assert.NoError(t, c.Err(), "an I/O error must not break the connection")
		}
	}
	zeroedBy := func(fn func(off, n int64) error) func(t *testing.T) {
		return func(t *testing.T) {
			off, n := int64(3*blockdev.BlockSize+100), int64(5*blockdev.BlockSize)
			_, err := c.WriteAt(pattern(9, int(n)+200), off-100)
			require.NoError(t, err)
			require.NoError(t, fn(off, n))
			got := readBack(t, off-100, int(n)+200)
			assert.Equal(t, pattern(9, 100), got[:100], "before the range")
			assert.Equal(t, make([]byte, n), got[100:100+n], "the range")
			assert.Equal(t, pattern(9, int(n)+200)[100+n:], got[100+n:], "after the range")
		}
	}

	tests := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"aligned write/read", writeRead(8*blockdev.BlockSize, 4*blockdev.BlockSize)},
		{"unaligned write/read", writeRead(1000, 3*blockdev.BlockSize+7)},
		{"one byte at the end", writeRead(devSize-1, 1)},
		{"1 MiB", writeRead(1<<20, 1<<20)},
		{"larger than one frame", writeRead(4096+3, MaxIOSize+5*blockdev.BlockSize+11)},
		{"zero-length read/write", func(t *testing.T) {
			n, err := c.WriteAt(nil, 5)
			require.NoError(t, err)
			assert.Zero(t, n)
			n, err = c.ReadAt([]byte{}, devSize)
			require.NoError(t, err)
			assert.Zero(t, n)
		}},
		{"read past the end", outOfRange(func() error { _, err := c.ReadAt(make([]byte, 10), devSize-5); return err })},
		{"write past the end", outOfRange(func() error { _, err := c.WriteAt(make([]byte, 10), devSize-5); return err })},
		{"read at a negative offset", outOfRange(func() error { _, err := c.ReadAt(make([]byte, 10), -1); return err })},
		{"write at an overflowing offset", outOfRange(func() error { _, err := c.WriteAt(make([]byte, 10), math.MaxInt64-3); return err })},
		{"unmap past the end", outOfRange(func() error { return c.Unmap(devSize-4096, 8192) })},
		{"write zeroes past the end", outOfRange(func() error { return c.WriteZeroes(devSize+1, 0) })},
		{"negative length", outOfRange(func() error { return c.Unmap(0, -1) })},
		{"unmap", zeroedBy(c.Unmap)},
		{"write zeroes", zeroedBy(c.WriteZeroes)},
		{"flush", func(t *testing.T) { require.NoError(t, c.Flush()) }},
		{"size", func(t *testing.T) {
			assert.Equal(t, int64(devSize), c.Size())
			mem.Resize(devSize + 4096)
			defer mem.Resize(devSize)
			size, err := c.SizeContext(context.Background())
			require.NoError(t, err)
			assert.Equal(t, int64(devSize+4096), size)
		}},
		{"ping", func(t *testing.T) { require.NoError(t, c.Ping(context.Background())) }},
		{"remote error matches ErrRemote", func(t *testing.T) {
			_, err := c.ReadAt(make([]byte, 1), devSize)
			var re *RemoteError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, OpRead, re.Op)
			assert.Equal(t, StatusOutOfRange, re.Status)
			assert.ErrorIs(t, err, ErrRemote)
			assert.NotErrorIs(t, err, ErrConnectionClosed)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.run)
	}
}

func TestControl(t *testing.T) {
	checkGoroutines(t)
	type echo struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	}
	h := &testHandler{Device: blockdev.NewMem(1 << 20)}
	h.control = func(_ context.Context, method string, args json.RawMessage) (json.RawMessage, error) {
		switch method {
		case "echo":
			return args, nil
		case "args-len":
			return json.RawMessage(fmt.Sprint(len(args))), nil
		case "fail":
			return nil, errors.New("disk on fire")
		case "missing":
			return nil, fmt.Errorf("snapshot %s: %w", args, ErrNotFound)
		case "invalid":
			return nil, fmt.Errorf("bad name: %w", ErrInvalidArgument)
		case "exists":
			return nil, fmt.Errorf("snapshot s1: %w", ErrAlreadyExists)
		case "limit":
			return nil, fmt.Errorf("250 snapshots: %w", ErrLimitExceeded)
		case "out-of-range":
			return nil, fmt.Errorf("layer read: %w", blockdev.ErrOutOfRange)
		case "huge-error":
			return nil, errors.New(strings.Repeat("x", 3*MaxErrorLen))
		case "no-reply":
			return nil, nil
		}
		return nil, fmt.Errorf("%q: %w", method, ErrUnknownMethod)
	}
	_, addr := startServer(t, h, nil)
	c := dial(t, addr, Options{})
	ctx := context.Background()

	tests := []struct {
		name      string
		method    string
		args      any
		reply     any
		wantReply any
		wantErr   error
		wantMsg   string
	}{
		{name: "struct round trip", method: "echo", args: echo{"snap-1", 3}, reply: &echo{}, wantReply: &echo{"snap-1", 3}},
		{name: "raw args and reply", method: "echo", args: json.RawMessage(`{"a":[1,2]}`), reply: &json.RawMessage{}, wantReply: ptr(json.RawMessage(`{"a":[1,2]}`))},
		{name: "no args", method: "args-len", reply: new(int), wantReply: ptr(0)},
		{name: "args arrive intact", method: "args-len", args: "abc", reply: new(int), wantReply: ptr(5)},
		{name: "nil reply ignores result", method: "echo", args: 1},
		{name: "empty reply leaves target", method: "no-reply", reply: ptr(7), wantReply: ptr(7)},
		{name: "handler error", method: "fail", wantErr: ErrRemote, wantMsg: "disk on fire"},
		{name: "not found", method: "missing", args: "s1", wantErr: ErrNotFound},
		{name: "invalid argument", method: "invalid", wantErr: ErrInvalidArgument},
		{name: "already exists", method: "exists", wantErr: ErrAlreadyExists},
		{name: "limit exceeded", method: "limit", wantErr: ErrLimitExceeded},
		{name: "out of range", method: "out-of-range", wantErr: blockdev.ErrOutOfRange},
		{name: "unknown method", method: "bogus", wantErr: ErrUnknownMethod},
		{name: "long error is truncated", method: "huge-error", wantErr: ErrRemote, wantMsg: strings.Repeat("x", 100)},
		{name: "empty method", method: "", wantErr: ErrInvalidArgument},
		{name: "method too long", method: strings.Repeat("m", MaxMethodLen+1), wantErr: ErrInvalidArgument},
		{name: "unencodable args", method: "echo", args: func() {}, wantMsg: "encoding args"},
		{name: "reply does not decode", method: "echo", args: "text", reply: new(int), wantMsg: "decoding reply"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Control(ctx, tc.method, tc.args, tc.reply)
			if tc.wantErr == nil && tc.wantMsg == "" {
				require.NoError(t, err)
				if tc.wantReply != nil {
					assert.Equal(t, tc.wantReply, tc.reply)
				}
				return
			}
			require.Error(t, err)
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
			}
			assert.Contains(t, err.Error(), tc.wantMsg)
			assert.NoError(t, c.Err(), "a failed call must not break the connection")
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestTimeoutAndCancel checks that a stuck call gives up on time, that its
// late reply is discarded, and that the connection keeps working.
func TestTimeoutAndCancel(t *testing.T) {
	checkGoroutines(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	h := &testHandler{Device: blockdev.NewMem(1 << 20)}
	h.control = func(ctx context.Context, method string, _ json.RawMessage) (json.RawMessage, error) {
		<-release
		return json.RawMessage(`"late"`), nil
	}
	_, addr := startServer(t, h, nil)
	t.Cleanup(releaseAll) // runs before the server's Close if the test fails early
	c := dial(t, addr, Options{Timeout: 200 * time.Millisecond})

	// The handler blocks until the test ends: only the call timeout can
	// end the call.
	var err error
	noHang(t, "a call to a blocked handler", func() { err = c.Control(context.Background(), "block", nil, nil) })
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	noHang(t, "a call with a deadline", func() { err = c.Control(ctx, "block", nil, nil) })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, ErrTimeout)

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, c.Ping(ctx), context.Canceled)

	releaseAll() // the two late replies arrive for abandoned seqs
	require.NoError(t, c.Ping(context.Background()))
	p := []byte("still works")
	_, err = c.WriteAt(p, 0)
	require.NoError(t, err)
	require.NoError(t, c.Err())
}

// TestConcurrentIO runs many goroutines doing mixed I/O on their own
// regions through one connection and checks every byte against a model.
func TestConcurrentIO(t *testing.T) {
	checkGoroutines(t)
	const workers, region, opsEach = 16, 256 << 10, 150
	mem := blockdev.NewMem(workers * region)
	_, addr := startServer(t, &testHandler{Device: &jitterDev{Device: mem, maxDelay: 100 * time.Microsecond}}, nil)
	c := dial(t, addr, Options{Timeout: 20 * time.Second})

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- ioWorker(c, int64(w*region), region, opsEach, uint64(w))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func ioWorker(c *Client, base int64, region, ops int, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 42))
	model := make([]byte, region)
	for i := range ops {
		off := rng.IntN(region)
		n := rng.IntN(min(region-off, 64<<10) + 1)
		switch rng.IntN(5) {
		case 0, 1:
			data := pattern(byte(rng.Uint32()), n)
			if _, err := c.WriteAt(data, base+int64(off)); err != nil {
				return fmt.Errorf("op %d write: %w", i, err)
			}
			copy(model[off:], data)
		case 2:
			if err := c.WriteZeroes(base+int64(off), int64(n)); err != nil {
				return fmt.Errorf("op %d write zeroes: %w", i, err)
			}
			clear(model[off : off+n])
		default:
			got := make([]byte, n)
			if _, err := c.ReadAt(got, base+int64(off)); err != nil {
				return fmt.Errorf("op %d read: %w", i, err)
			}
			if !bytes.Equal(got, model[off:off+n]) {
				return fmt.Errorf("op %d: read at %d+%d differs from the model", i, off, n)
			}
		}
	}
	return nil
}

// TestTightServerLimits: with room for a single request per connection the
// server still makes progress (an oversized request is admitted alone),
// and several clients share one server.
func TestTightServerLimits(t *testing.T) {
	checkGoroutines(t)
	const clients, workers, region = 2, 4, 128 << 10
	mem := blockdev.NewMem(clients * workers * region)
	_, addr := startServer(t, &testHandler{Device: mem}, nil, WithMaxInFlight(1), WithMaxInFlightBytes(1))
	var wg sync.WaitGroup
	errs := make(chan error, clients*workers)
	for i := range clients {
		c := dial(t, addr, Options{Timeout: 20 * time.Second})
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := i*workers + w
				errs <- ioWorker(c, int64(n*region), region, 60, uint64(n))
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
