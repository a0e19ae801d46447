package backupstore

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The test harness: one place for the stores, volumes and readers the
// tests share.

const testChunk = 64 << 10 // the smallest chunk size keeps tests fast

type env struct {
	t     *testing.T
	dir   string
	files *FileStore
	count *CountingStore
	tgt   *Target
}

func newEnv(t *testing.T, packSize int64) *env {
	t.Helper()
	dir := t.TempDir()
	fs, err := NewFileStore(dir)
	require.NoError(t, err)
	cs := NewCountingStore(fs)
	tgt, err := Open(context.Background(), cs, Options{ChunkSize: testChunk, PackSize: packSize})
	require.NoError(t, err)
	return &env{t: t, dir: dir, files: fs, count: cs, tgt: tgt}
}

// reopen returns a fresh Target on the same store: an empty index cache,
// as a new process would have.
func (e *env) reopen() *Target {
	tgt, err := Open(context.Background(), e.count, Options{})
	require.NoError(e.t, err)
	return tgt
}

// volume is random data with whole zero chunks and a zero gap inside a
// chunk, of size bytes (not a multiple of the chunk size).
func volume(seed uint64, size int64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	for c := int64(3); c*testChunk < size; c += 5 {
		clear(b[c*testChunk : min(size, (c+1)*testChunk)])
	}
	if size > testChunk+5000 {
		clear(b[testChunk+100 : testChunk+5000])
	}
	return b
}

func (e *env) backup(in BackupInput) *Manifest {
	e.t.Helper()
	if in.Snapshot == "" {
		in.Snapshot = "snap-" + in.Backup
	}
	m, err := e.tgt.Backup(context.Background(), in)
	require.NoError(e.t, err)
	return m
}

// memDst is a WriterAt over a byte slice of the volume's size.
type memDst struct {
	mu  sync.Mutex
	buf []byte
}

func (d *memDst) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(d.buf[off:], p), nil
}

func restore(t *testing.T, tgt *Target, m *Manifest, backing []byte, opts RestoreOptions) ([]byte, error) {
	d := &memDst{buf: make([]byte, m.VolumeSize)}
	var br *bytes.Reader
	if backing != nil {
		br = bytes.NewReader(backing)
	}
	var err error
	if br != nil {
		err = tgt.Restore(context.Background(), m, d, br, opts)
	} else {
		err = tgt.Restore(context.Background(), m, d, nil, opts)
	}
	return d.buf, err
}

// recordingReader remembers which offsets were read.
type recordingReader struct {
	r     *bytes.Reader
	mu    sync.Mutex
	reads []int64
}

func (r *recordingReader) ReadAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	r.reads = append(r.reads, off)
	r.mu.Unlock()
	return r.r.ReadAt(p, off)
}

func (r *recordingReader) offsets() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]int64(nil), r.reads...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// objects lists keys under prefix straight from the FileStore.
func (e *env) objects(prefix string) []ObjectInfo {
	objs, err := e.files.List(context.Background(), prefix)
	require.NoError(e.t, err)
	return objs
}
