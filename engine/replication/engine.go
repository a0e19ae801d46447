// Package replication is a volume's engine: the single writer that fans each
// write out to every replica, reads from one healthy replica, and takes
// snapshots on all replicas at one point in the write stream. A replica that
// fails is marked ERR and the volume goes on with the rest.
package replication

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
)

// Mode is the engine's view of one replica.
type Mode string

const (
	// ModeRW serves reads and writes.
	ModeRW Mode = "RW"
	// ModeWO takes writes only, while it is being rebuilt.
	ModeWO Mode = "WO"
	// ModeERR failed; it takes no I/O until it is removed.
	ModeERR Mode = "ERR"
)

// Backend is a replica as the engine reaches it: block I/O plus control calls
// that run in order with that I/O (the dataconn client is one).
type Backend interface {
	blockdev.Device
	Control(ctx context.Context, method string, args, reply any) error
	Close() error
}

var (
	// ErrNoHealthyReplica is returned when no replica can serve a request.
	ErrNoHealthyReplica = errors.New("no healthy replica")
	// ErrSnapshotNotFound is returned for an operation on a snapshot the
	// volume does not have.
	ErrSnapshotNotFound = errors.New("snapshot not found")
)

type replica struct {
	name    string
	address string
	backend Backend
	mode    Mode
	err     error
	timers  replicaTimers
}

// ReplicaStatus is a replica as the engine sees it.
type ReplicaStatus struct {
	Name, Address string
	Mode          Mode
	Error         string
}

// Engine replicates a block device over a set of replicas. It is a
// blockdev.Device itself, served to clients by the frontend.
type Engine struct {
	volume string
	log    logrus.FieldLogger

	// io is held shared by every I/O and exclusively by snapshot and
	// membership changes, so those happen between two writes, never during one.
	io       sync.RWMutex
	mu       sync.Mutex // guards replicas' modes, and size
	size     int64
	replicas map[string]*replica
	nextRead atomic.Uint64
	rb       rebuilds // see rebuild.go
	fz       freeze   // a group cut's freeze, see freeze.go
	// changes counts completed data-changing calls (write, trim, zeroing),
	// so a size reporter can tell an idle volume from one that grew
	// without asking a replica (see DataVersion).
	changes atomic.Uint64

	onChange func()
}

// New returns an engine for a volume of size bytes with no replicas yet.
// onChange (may be nil) is called after every change of replica modes or
// membership, for watchers.
func New(volume string, size int64, log logrus.FieldLogger, onChange func()) *Engine {
	if onChange == nil {
		onChange = func() {}
	}
	return &Engine{volume: volume, size: size, replicas: map[string]*replica{},
		log: log.WithField("volume", volume), onChange: onChange}
}

// AddReplica attaches a connected replica in the given mode (RW for one
// that already holds the volume's data, WO for one about to be rebuilt).
func (e *Engine) AddReplica(name, address string, backend Backend, mode Mode) error {
	if backend.Size() != e.Size() {
		return fmt.Errorf("replica %s has size %d, the volume %d", name, backend.Size(), e.Size())
	}
	e.io.Lock()
	defer e.io.Unlock()
	e.mu.Lock()
	if _, ok := e.replicas[name]; ok {
		e.mu.Unlock()
		return fmt.Errorf("replica %s is already attached", name)
	}
	e.replicas[name] = &replica{name: name, address: address, backend: backend, mode: mode,
		timers: newReplicaTimers(e.volume, name)}
	e.mu.Unlock()
	e.log.WithFields(logrus.Fields{"replica": name, "address": address, "mode": mode}).Info("Replica added")
	e.onChange()
	return nil
}

// AddFailedReplica lists a replica the engine could not attach (unreachable,
// wrong size) in ERR with the cause, so that watchers see a member that
// needs replacing rather than one silently left out. It takes no I/O;
// RemoveReplica drops it.
func (e *Engine) AddFailedReplica(name, address string, cause error) error {
	if cause == nil {
		cause = errors.New("not connected")
	}
	e.io.Lock()
	defer e.io.Unlock()
	e.mu.Lock()
	if _, ok := e.replicas[name]; ok {
		e.mu.Unlock()
		return fmt.Errorf("replica %s is already attached", name)
	}
	e.replicas[name] = &replica{name: name, address: address, backend: failedBackend{cause}, mode: ModeERR, err: cause}
	e.mu.Unlock()
	e.log.WithError(cause).WithFields(logrus.Fields{"replica": name, "address": address}).Warn("Replica not connected; listed as ERR")
	e.onChange()
	return nil
}

// failedBackend stands for a replica that was never connected. ERR
// replicas get no I/O, so its methods only guard against a mistake.
type failedBackend struct{ err error }

func (b failedBackend) ReadAt([]byte, int64) (int, error)               { return 0, b.err }
func (b failedBackend) WriteAt([]byte, int64) (int, error)              { return 0, b.err }
func (b failedBackend) Size() int64                                     { return 0 }
func (b failedBackend) Flush() error                                    { return b.err }
func (b failedBackend) Unmap(int64, int64) error                        { return b.err }
func (b failedBackend) WriteZeroes(int64, int64) error                  { return b.err }
func (b failedBackend) Control(context.Context, string, any, any) error { return b.err }
func (b failedBackend) Close() error                                    { return nil }

// DataVersion changes after every write, trim or zeroing that returned,
// successful or not. Equal values mean no data change in between, so the
// replicas' allocated sizes need not be read again.
func (e *Engine) DataVersion() uint64 { return e.changes.Load() }

// RemoveReplica detaches a replica and closes its connection.
func (e *Engine) RemoveReplica(name string) error {
	e.io.Lock()
	defer e.io.Unlock()
	e.mu.Lock()
	r, ok := e.replicas[name]
	delete(e.replicas, name)
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("replica %s is not attached", name)
	}
	_ = r.backend.Close()
	forgetReplicaTimers(e.volume, name)
	e.log.WithField("replica", name).Info("Replica removed")
	e.onChange()
	return nil
}

// Replicas lists the replicas, sorted by name.
func (e *Engine) Replicas() []ReplicaStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]ReplicaStatus, 0, len(e.replicas))
	for _, r := range e.replicas {
		s := ReplicaStatus{Name: r.name, Address: r.address, Mode: r.mode}
		if r.err != nil {
			s.Error = r.err.Error()
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Backend returns a replica's connection, for control calls made elsewhere
// (rebuild, chain listing).
func (e *Engine) Backend(name string) (Backend, Mode, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.replicas[name]
	if !ok {
		return nil, "", false
	}
	return r.backend, r.mode, true
}

// markERR takes a replica out of service after an I/O or control failure.
func (e *Engine) markERR(r *replica, err error) {
	e.mu.Lock()
	changed := r.mode != ModeERR
	r.mode, r.err = ModeERR, err
	e.mu.Unlock()
	if changed {
		e.log.WithError(err).WithField("replica", r.name).Warn("Replica failed; marked ERR")
		e.onChange()
	}
}

// targets returns the replicas that take writes (RW and WO) with their
// modes at this moment, and those that serve reads (RW).
func (e *Engine) targets() (writers, readers []*replica, writerModes []Mode) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.replicas {
		switch r.mode {
		case ModeRW:
			writers = append(writers, r)
			writerModes = append(writerModes, r.mode)
			readers = append(readers, r)
		case ModeWO:
			writers = append(writers, r)
			writerModes = append(writerModes, r.mode)
		}
	}
	// A stable order keeps read spreading fair and logs readable.
	sort.Slice(readers, func(i, j int) bool { return readers[i].name < readers[j].name })
	return writers, readers, writerModes
}
