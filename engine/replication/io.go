package replication

import (
	"fmt"
	"sync"
	"time"

	"github.com/strata-storage/strata/engine/blockdev"
)

// Size is the volume size in bytes.
func (e *Engine) Size() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.size
}

// ReadAt reads from one RW replica, spreading reads over them; a replica
// that fails is marked ERR and the next one is tried.
func (e *Engine) ReadAt(p []byte, off int64) (int, error) {
	if err := blockdev.CheckRange(off, int64(len(p)), e.Size()); err != nil {
		return 0, err
	}
	e.io.RLock()
	defer e.io.RUnlock()
	_, readers, _ := e.targets()
	if len(readers) == 0 {
		return 0, ErrNoHealthyReplica
	}
	start := int(e.nextRead.Add(1))
	var lastErr error
	for i := range readers {
		r := readers[(start+i)%len(readers)]
		start := time.Now()
		n, err := r.backend.ReadAt(p, off)
		observeSince(r.timers.read, start)
		if err == nil {
			return n, nil
		}
		lastErr = err
		e.markERR(r, fmt.Errorf("read: %w", err))
	}
	return 0, fmt.Errorf("%w: last error: %v", ErrNoHealthyReplica, lastErr)
}

// WriteAt writes to every RW and WO replica in parallel and succeeds when
// every one that is still healthy has the data; failed replicas go ERR. The
// write fails only if no RW replica took it.
func (e *Engine) WriteAt(p []byte, off int64) (int, error) {
	if err := blockdev.CheckRange(off, int64(len(p)), e.Size()); err != nil {
		return 0, err
	}
	err := e.fanOutChange("write", func(r *replica) error {
		start := time.Now()
		_, err := r.backend.WriteAt(p, off)
		observeSince(r.timers.write, start)
		return err
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush flushes every replica.
func (e *Engine) Flush() error {
	return e.fanOut("flush", func(r *replica) error { return r.backend.Flush() })
}

// Unmap passes a trim to every replica.
func (e *Engine) Unmap(off, length int64) error {
	if err := blockdev.CheckRange(off, length, e.Size()); err != nil {
		return err
	}
	return e.fanOutChange("unmap", func(r *replica) error { return r.backend.Unmap(off, length) })
}

// WriteZeroes zeroes a range on every replica.
func (e *Engine) WriteZeroes(off, length int64) error {
	if err := blockdev.CheckRange(off, length, e.Size()); err != nil {
		return err
	}
	return e.fanOutChange("write-zeroes", func(r *replica) error { return r.backend.WriteZeroes(off, length) })
}

func (e *Engine) fanOut(what string, op func(*replica) error) error {
	e.io.RLock()
	defer e.io.RUnlock()
	return e.fanOutLocked(what, op)
}

// fanOutChange is fanOut for a call that changes data (not a flush).
// DataVersion moves only once the call has returned, so a reader that sees
// the new version and then asks a replica for its sizes finds this change
// in them.
func (e *Engine) fanOutChange(what string, op func(*replica) error) error {
	defer e.changes.Add(1)
	return e.fanOut(what, op)
}

// fanOutLocked runs op on every writer in parallel; the caller holds e.io.
func (e *Engine) fanOutLocked(what string, op func(*replica) error) error {
	writers, _, modes := e.targets()
	if len(writers) == 0 {
		return ErrNoHealthyReplica
	}
	errs := make([]error, len(writers))
	if len(writers) == 1 {
		errs[0] = op(writers[0])
	} else {
		var wg sync.WaitGroup
		for i, r := range writers {
			wg.Go(func() { errs[i] = op(r) })
		}
		wg.Wait()
	}
	okRW := false
	var firstErr error
	for i, r := range writers {
		if errs[i] != nil {
			if firstErr == nil {
				firstErr = errs[i]
			}
			e.markERR(r, fmt.Errorf("%s: %w", what, errs[i]))
			continue
		}
		if modes[i] == ModeRW {
			okRW = true
		}
	}
	if !okRW {
		return fmt.Errorf("%s: %w: %v", what, ErrNoHealthyReplica, firstErr)
	}
	return nil
}
