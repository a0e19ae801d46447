package blockdev

import "sync"

// Mem is a Device held in memory. It is the reference model the data plane's
// model-based tests compare against, and a backend for protocol tests.
type Mem struct {
	mu   sync.RWMutex
	data []byte
}

// NewMem returns a zero-filled in-memory device of size bytes.
func NewMem(size int64) *Mem { return &Mem{data: make([]byte, size)} }

func (m *Mem) Size() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return int64(len(m.data))
}

func (m *Mem) ReadAt(p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if err := CheckRange(off, int64(len(p)), int64(len(m.data))); err != nil {
		return 0, err
	}
	return copy(p, m.data[off:]), nil
}

func (m *Mem) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := CheckRange(off, int64(len(p)), int64(len(m.data))); err != nil {
		return 0, err
	}
	return copy(m.data[off:], p), nil
}

func (m *Mem) Flush() error { return nil }

// Unmap zeroes the range: one of the contents the Unmap contract allows.
func (m *Mem) Unmap(off, length int64) error { return m.WriteZeroes(off, length) }

func (m *Mem) WriteZeroes(off, length int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := CheckRange(off, length, int64(len(m.data))); err != nil {
		return err
	}
	clear(m.data[off : off+length])
	return nil
}

// Resize grows or shrinks the device, zero-filling new space.
func (m *Mem) Resize(size int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if size <= int64(len(m.data)) {
		m.data = m.data[:size]
		return
	}
	m.data = append(m.data, make([]byte, size-int64(len(m.data)))...)
}
