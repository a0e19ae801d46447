package backupstore

import (
	"context"
	"io"
	"sort"
	"sync"
)

// CallCount is what a CountingStore saw of one method: calls, and bytes
// sent (Put, PutIfAbsent) or received (Get, GetRange).
type CallCount struct {
	Calls int64
	Bytes int64
}

// CountingStore wraps an ObjectStore and counts calls and bytes per method,
// for tests that assert on requests and for the figures in the docs.
type CountingStore struct {
	ObjectStore
	mu     sync.Mutex
	counts map[string]CallCount
}

func NewCountingStore(s ObjectStore) *CountingStore {
	return &CountingStore{ObjectStore: s, counts: map[string]CallCount{}}
}

func (c *CountingStore) add(method string, calls, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cc := c.counts[method]
	cc.Calls += calls
	cc.Bytes += bytes
	c.counts[method] = cc
}

// Counts returns a copy of the counts so far, by method name.
func (c *CountingStore) Counts() map[string]CallCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]CallCount, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// Requests is the total number of calls, every method together.
func (c *CountingStore) Requests() int64 {
	var n int64
	for _, v := range c.Counts() {
		n += v.Calls
	}
	return n
}

// Writes is the number of objects written (Put and PutIfAbsent calls).
func (c *CountingStore) Writes() int64 {
	cs := c.Counts()
	return cs["Put"].Calls + cs["PutIfAbsent"].Calls
}

// Reset zeroes the counts.
func (c *CountingStore) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts = map[string]CallCount{}
}

// Methods lists the methods called so far, sorted (for stable test output).
func (c *CountingStore) Methods() []string {
	cs := c.Counts()
	out := make([]string, 0, len(cs))
	for k := range cs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type countingWriter struct {
	c *CountingStore
	m string
}

func (w countingWriter) Write(p []byte) (int, error) {
	w.c.add(w.m, 0, int64(len(p)))
	return len(p), nil
}

func (c *CountingStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	c.add("Put", 1, 0)
	return c.ObjectStore.Put(ctx, key, io.TeeReader(r, countingWriter{c, "Put"}), size)
}

func (c *CountingStore) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	c.add("PutIfAbsent", 1, int64(len(data)))
	return c.ObjectStore.PutIfAbsent(ctx, key, data)
}

type countingReadCloser struct {
	io.Reader
	io.Closer
}

func (c *CountingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	c.add("Get", 1, 0)
	rc, err := c.ObjectStore.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return countingReadCloser{io.TeeReader(rc, countingWriter{c, "Get"}), rc}, nil
}

func (c *CountingStore) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	c.add("GetRange", 1, 0)
	rc, err := c.ObjectStore.GetRange(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	return countingReadCloser{io.TeeReader(rc, countingWriter{c, "GetRange"}), rc}, nil
}

func (c *CountingStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	c.add("Stat", 1, 0)
	return c.ObjectStore.Stat(ctx, key)
}

func (c *CountingStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	c.add("List", 1, 0)
	return c.ObjectStore.List(ctx, prefix)
}

func (c *CountingStore) Delete(ctx context.Context, key string) error {
	c.add("Delete", 1, 0)
	return c.ObjectStore.Delete(ctx, key)
}
