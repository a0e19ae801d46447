package replication

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/replicactl"
)

// Rebuild fills a replica T from a healthy RW replica S while the volume
// keeps serving. T may be new and empty, or a replica that failed and came
// back with the snapshots it had: those S still has unchanged are kept.
//
//  1. T is told to begin an import (replicactl.ImportBegin, with Reuse)
//     before it sees any write, once its backing file is checked against
//     S's (see checkBacking). A T that is not empty gets an empty head at
//     the root of its chain; its snapshots wait for the commit.
//  2. Between two writes (the I/O lock held exclusively) every writer takes
//     the system snapshot rebuild-<random> and T joins in WO mode. From then
//     on T's head and S's head get the same writes in the same order, and
//     the layers below S's head are fixed: structural changes (snapshot,
//     remove, revert, expand, purge) are refused with ErrBusy until the
//     rebuild ends, and a rebuild is refused while a purge runs.
//  3. Every snapshot layer of S (the whole tree, removed ones included)
//     that T does not have is copied to T over connections of the
//     rebuild's own, so that its control calls, which are barriers, never
//     stall the volume's I/O: extents and read-layer on S, import-write on
//     T, reading and writing overlapped. A layer T has under the same name
//     with the same ID (replicactl.Reusable; IDs say "same blocks", see
//     replica/layerid.go) is neither read nor sent. S's backing file is
//     not copied: T has its own copy of the image.
//  4. T commits the import (replicactl.ImportCommit): its chain becomes
//     S's, the kept layers from its own files and the others from the
//     copies, all with S's metadata; T's other snapshots are dropped. Its
//     head keeps the data written since step 2 and gets rebuild-<random>
//     as parent. The replica resolves what its head could not know without
//     the lower layers (partial-block writes, trims, zeroing; see
//     replica/import.go), so T then reads exactly like S.
//  5. T goes RW.
//
// T does not take the rebuild snapshot itself: it joins at the snapshot's
// point in the write stream, so its own copy would be empty, and S's copy
// of that layer is what T needs anyway.
//
// A failure at any step after T joined leaves T attached in ERR with the
// error in its rebuild status; the volume goes on with the other replicas.

// ErrBusy refuses an operation that cannot run alongside another one now:
// a purge or another structural change during a rebuild, a rebuild during a
// purge or another rebuild.
var ErrBusy = errors.New("busy")

// Rebuild states, as RebuildStatus.State.
const (
	RebuildInProgress = "in-progress"
	RebuildComplete   = "complete"
	RebuildError      = "error"
)

// RebuildStatus is the progress of one replica's rebuild.
type RebuildStatus struct {
	IsRebuilding bool
	Progress     int // percent of the data to copy that is copied
	State        string
	Error        string
	FromReplica  string
	// CopiedBytes is the layer data sent so far (zero runs included, which
	// travel as a length), updated with Progress. CopiedLayers layers are
	// copied; KeptLayers layers, holding KeptBytes on the source, were
	// already on the replica and are kept. The counts are known once the
	// copy starts.
	CopiedBytes, KeptBytes   int64
	CopiedLayers, KeptLayers int
}

// RebuildOptions describe a replica to rebuild.
type RebuildOptions struct {
	// Replica and Address name the new replica.
	Replica, Address string
	// Target is the engine's connection to it, which becomes its backend.
	Target Backend
	// Dial opens additional connections to replicas, for the copy.
	Dial func(ctx context.Context, address string) (Backend, error)
	// Source is the RW replica to copy from; empty picks the first by name.
	Source string
}

// rebuildChunk is the data one read-layer / import-write call carries.
const rebuildChunk = replicactl.MaxImportWrite

// rebuilds is an engine's rebuild state.
type rebuilds struct {
	// gate is held by a structural change for its whole run, and by a
	// rebuild while it starts, so one never starts inside the other.
	gate   sync.Mutex
	mu     sync.Mutex // active, status
	active string     // the replica being rebuilt, "" if none
	cancel context.CancelFunc
	status map[string]RebuildStatus
}

// structural is called by operations that change the chain. It refuses
// them during a rebuild; otherwise the caller must call release when done.
func (e *Engine) structural(what string) (release func(), err error) {
	if cut := e.FrozenFor(); cut != "" {
		// Not waiting out the freeze: the caller may hold what its thaw needs.
		return nil, fmt.Errorf("%s of volume %s: frozen for group cut %s: %w", what, e.volume, cut, ErrBusy)
	}
	e.rb.gate.Lock()
	e.rb.mu.Lock()
	active := e.rb.active
	e.rb.mu.Unlock()
	if active != "" {
		e.rb.gate.Unlock()
		return nil, fmt.Errorf("%s of volume %s: replica %s is being rebuilt: %w", what, e.volume, active, ErrBusy)
	}
	return e.rb.gate.Unlock, nil
}

// RebuildStatus reports the rebuilds of the replicas attached now: the
// running one and how earlier ones ended.
func (e *Engine) RebuildStatus() map[string]RebuildStatus {
	e.rb.mu.Lock()
	defer e.rb.mu.Unlock()
	out := map[string]RebuildStatus{}
	e.mu.Lock()
	defer e.mu.Unlock()
	for name, st := range e.rb.status {
		if _, ok := e.replicas[name]; ok {
			out[name] = st
		}
	}
	return out
}

// CancelRebuild stops a running rebuild; it ends in error.
func (e *Engine) CancelRebuild() {
	e.rb.mu.Lock()
	defer e.rb.mu.Unlock()
	if e.rb.cancel != nil {
		e.rb.cancel()
	}
}

func (e *Engine) setRebuildStatus(name string, st RebuildStatus) {
	e.rb.mu.Lock()
	if e.rb.status == nil {
		e.rb.status = map[string]RebuildStatus{}
	}
	changed := e.rb.status[name] != st
	e.rb.status[name] = st
	e.rb.mu.Unlock()
	if changed {
		e.onChange()
	}
}

// Rebuild runs a whole rebuild and returns when it has ended.
func (e *Engine) Rebuild(ctx context.Context, o RebuildOptions) error {
	done, err := e.StartRebuild(ctx, o)
	if err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		e.CancelRebuild()
		return <-done
	}
}

// StartRebuild attaches a new replica in WO mode and starts copying into it
// in the background; it returns once the replica takes the volume's writes.
// The channel receives the rebuild's result. ctx bounds only the start.
func (e *Engine) StartRebuild(ctx context.Context, o RebuildOptions) (<-chan error, error) {
	if o.Target == nil || o.Dial == nil || o.Replica == "" {
		return nil, errors.New("rebuild: replica name, target connection and dialer are required")
	}
	if size := o.Target.Size(); size != e.Size() {
		return nil, fmt.Errorf("rebuild: replica %s has size %d, the volume %d", o.Replica, size, e.Size())
	}
	source, sourceAddr, err := e.claimRebuild(ctx, o)
	if err != nil {
		return nil, err
	}
	log := e.log.WithFields(logrus.Fields{"replica": o.Replica, "source": source})
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.rb.mu.Lock()
	e.rb.cancel = cancel
	e.rb.mu.Unlock()
	status := RebuildStatus{IsRebuilding: true, State: RebuildInProgress, FromReplica: source}
	e.setRebuildStatus(o.Replica, status)

	job := &rebuildJob{e: e, o: o, log: log, status: status}
	err = job.start(ctx, sourceAddr)
	if err != nil {
		cancel()
		job.finish(err)
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		err := job.copy(bg)
		cancel()
		job.finish(err)
		done <- err
	}()
	return done, nil
}

// claimRebuild makes o.Replica the engine's one rebuild, or refuses.
func (e *Engine) claimRebuild(ctx context.Context, o RebuildOptions) (source, address string, err error) {
	e.rb.gate.Lock()
	defer e.rb.gate.Unlock()
	e.rb.mu.Lock()
	active := e.rb.active
	e.rb.mu.Unlock()
	if active != "" {
		return "", "", fmt.Errorf("rebuild %s: replica %s is already being rebuilt: %w", o.Replica, active, ErrBusy)
	}
	if _, _, ok := e.Backend(o.Replica); ok {
		return "", "", fmt.Errorf("rebuild: replica %s is already attached", o.Replica)
	}
	for name, st := range e.PurgeStatus(ctx) {
		if st.IsPurging {
			return "", "", fmt.Errorf("rebuild %s: replica %s is purging snapshots: %w", o.Replica, name, ErrBusy)
		}
	}
	for _, r := range e.Replicas() {
		if r.Mode == ModeRW && (o.Source == "" || o.Source == r.Name) {
			source, address = r.Name, r.Address
			break
		}
	}
	if source == "" {
		return "", "", fmt.Errorf("rebuild %s: no RW replica %s to copy from: %w", o.Replica, o.Source, ErrNoHealthyReplica)
	}
	e.rb.mu.Lock()
	e.rb.active = o.Replica
	e.rb.mu.Unlock()
	return source, address, nil
}

// rebuildJob is one running rebuild.
type rebuildJob struct {
	e        *Engine
	o        RebuildOptions
	log      logrus.FieldLogger
	src, dst Backend // the copy's own connections to S and T
	snapshot string
	joined   bool // T is attached

	mu     sync.Mutex
	status RebuildStatus
	total  int64
	copied int64
	began  time.Time
}

// start begins the import on T and attaches it at the rebuild snapshot.
func (j *rebuildJob) start(ctx context.Context, sourceAddr string) error {
	e, o := j.e, j.o
	j.began = time.Now()
	var err error
	if j.src, err = o.Dial(ctx, sourceAddr); err != nil {
		return fmt.Errorf("rebuild %s: connecting to source %s: %w", o.Replica, j.status.FromReplica, err)
	}
	if j.dst, err = o.Dial(ctx, o.Address); err != nil {
		return fmt.Errorf("rebuild %s: second connection to it: %w", o.Replica, err)
	}
	if err := j.checkBacking(ctx); err != nil {
		return fmt.Errorf("rebuild %s: %w", o.Replica, err)
	}
	begin := replicactl.ImportBeginArgs{Reuse: true}
	if err := j.dst.Control(ctx, replicactl.ImportBegin, begin, nil); err != nil {
		return fmt.Errorf("rebuild %s: %w", o.Replica, err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	j.snapshot = "rebuild-" + hex.EncodeToString(rnd[:])
	args := replicactl.SnapshotArgs{Name: j.snapshot, Created: time.Now().UTC().Truncate(time.Second),
		ID: replicactl.NewLayerID()}

	e.io.Lock()
	defer e.io.Unlock()
	if err := e.snapshotLocked(ctx, args); err != nil {
		return fmt.Errorf("rebuild %s: %w", o.Replica, err)
	}
	e.mu.Lock()
	s := e.replicas[j.status.FromReplica]
	if s == nil || s.mode != ModeRW {
		e.mu.Unlock()
		return fmt.Errorf("rebuild %s: source %s failed taking the rebuild snapshot", o.Replica, j.status.FromReplica)
	}
	e.replicas[o.Replica] = &replica{name: o.Replica, address: o.Address, backend: o.Target, mode: ModeWO}
	e.mu.Unlock()
	j.joined = true
	j.log.WithField("snapshot", j.snapshot).Info("Rebuild started; replica added WO")
	e.onChange()
	return nil
}

// checkBacking refuses a target whose backing file cannot be the source's.
// Only snapshots are copied: where none holds a block, T reads its own
// backing file (a copy of the image on T's disk, at any path) and must
// read there what S reads in its own.
func (j *rebuildJob) checkBacking(ctx context.Context) error {
	var s, t replicactl.ChainReply
	if err := j.src.Control(ctx, replicactl.Chain, nil, &s); err != nil {
		return fmt.Errorf("reading the source's chain: %w", err)
	}
	if err := j.dst.Control(ctx, replicactl.Chain, nil, &t); err != nil {
		return fmt.Errorf("reading its chain: %w", err)
	}
	return replicactl.SameBacking("source "+j.status.FromReplica, s.Backing, "replica "+j.o.Replica, t.Backing)
}

// rebuildPiece is a chunk of one layer on its way from S to T.
type rebuildPiece struct {
	layer  string
	off    int64
	data   []byte
	zeroes bool
}

// copy copies S's snapshots into T, commits and promotes T.
func (j *rebuildJob) copy(ctx context.Context) error {
	var chain replicactl.ChainReply
	if err := j.src.Control(ctx, replicactl.Chain, nil, &chain); err != nil {
		return fmt.Errorf("reading the source's chain: %w", err)
	}
	if head := chain.Layers[replicactl.HeadName]; head.Parent != j.snapshot {
		return fmt.Errorf("the source's head is on %q, not on the rebuild snapshot %s", head.Parent, j.snapshot)
	}
	// T's snapshots cannot change during the import: it refuses snapshot,
	// purge, revert and expand while one runs.
	var own replicactl.ChainReply
	if err := j.dst.Control(ctx, replicactl.Chain, nil, &own); err != nil {
		return fmt.Errorf("reading its chain: %w", err)
	}
	var layers []replicactl.Layer
	var keep []string
	for name, l := range chain.Layers {
		if name != replicactl.HeadName {
			layers = append(layers, l)
		}
	}
	sort.Slice(layers, func(a, b int) bool { return layers[a].Name < layers[b].Name })
	j.mu.Lock()
	for _, l := range layers {
		if replicactl.Reusable(l, own.Layers[l.Name]) {
			keep = append(keep, l.Name)
			j.status.KeptLayers++
			j.status.KeptBytes += l.Size
		} else {
			j.status.CopiedLayers++
		}
	}
	st := j.status
	j.mu.Unlock()
	j.e.setRebuildStatus(j.o.Replica, st)
	if len(keep) > 0 {
		j.log.WithFields(logrus.Fields{"kept": keep, "keptBytes": st.KeptBytes}).Info("Rebuild keeps layers the replica has")
	}
	extents := make(map[string][]replicactl.Extent, len(layers))
	for _, l := range layers {
		if slices.Contains(keep, l.Name) {
			continue
		}
		var exts []replicactl.Extent
		if err := j.src.Control(ctx, replicactl.Extents, replicactl.NameArgs{Name: l.Name}, &exts); err != nil {
			return fmt.Errorf("extents of %s on the source: %w", l.Name, err)
		}
		extents[l.Name] = exts
		for _, x := range exts {
			j.total += x.Length
		}
	}

	// Read from S and write to T at the same time.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pieces := make(chan rebuildPiece, 2)
	readErr := make(chan error, 1)
	go func() {
		defer close(pieces)
		readErr <- j.readLayers(ctx, layers, extents, pieces)
	}()
	var werr error
	for p := range pieces {
		if werr == nil {
			werr = j.writePiece(ctx, p)
			if werr != nil {
				cancel()
			}
		}
	}
	if err := <-readErr; werr == nil && err != nil {
		werr = err
	}
	if werr != nil {
		return werr
	}

	if err := j.targetOK(); err != nil {
		return err
	}
	commit := replicactl.ImportCommitArgs{Layers: layers, HeadParent: j.snapshot, Keep: keep}
	if err := j.dst.Control(ctx, replicactl.ImportCommit, commit, nil); err != nil {
		return fmt.Errorf("committing the import: %w", err)
	}
	return j.promote()
}

// readLayers reads the extents given, by layer; layers without any (kept
// ones) are not read.
func (j *rebuildJob) readLayers(ctx context.Context, layers []replicactl.Layer, extents map[string][]replicactl.Extent,
	out chan<- rebuildPiece) error {
	for _, l := range layers {
		for _, x := range extents[l.Name] {
			for pos, end := x.Offset, x.Offset+x.Length; pos < end; {
				n := min(end-pos, rebuildChunk)
				var data dataconn.Raw
				args := replicactl.ReadLayerArgs{Layer: l.Name, Offset: pos, Length: n, Raw: true}
				if err := j.src.Control(ctx, replicactl.ReadLayer, args, &data); err != nil {
					return fmt.Errorf("reading %s at %d on the source: %w", l.Name, pos, err)
				}
				if int64(len(data)) != n {
					return fmt.Errorf("reading %s at %d on the source: got %d bytes, want %d", l.Name, pos, len(data), n)
				}
				p := rebuildPiece{layer: l.Name, off: pos, data: data}
				if allZero(data) {
					p.zeroes = true
				}
				select {
				case out <- p:
				case <-ctx.Done():
					return ctx.Err()
				}
				pos += n
			}
		}
	}
	return nil
}

var zeroChunk = make([]byte, 64<<10)

func allZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroChunk))
		if !bytes.Equal(p[:n], zeroChunk[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

func (j *rebuildJob) writePiece(ctx context.Context, p rebuildPiece) error {
	if err := j.targetOK(); err != nil {
		return err
	}
	var args any = replicactl.ImportWriteArgs{Layer: p.layer, Offset: p.off, Zeroes: int64(len(p.data))}
	if !p.zeroes {
		payload, err := replicactl.ImportWritePayload(replicactl.ImportWriteArgs{Layer: p.layer, Offset: p.off}, p.data)
		if err != nil {
			return err
		}
		args = dataconn.Raw(payload)
	}
	if err := j.dst.Control(ctx, replicactl.ImportWrite, args, nil); err != nil {
		return fmt.Errorf("writing %s at %d: %w", p.layer, p.off, err)
	}
	j.progress(int64(len(p.data)))
	return nil
}

func (j *rebuildJob) progress(n int64) {
	j.mu.Lock()
	j.copied += n
	pct := 99
	if j.total > 0 {
		pct = min(99, int(j.copied*100/j.total))
	}
	changed := pct != j.status.Progress
	if changed {
		// With the percentage only, so watchers get an event per percent.
		j.status.Progress, j.status.CopiedBytes = pct, j.copied
	}
	st := j.status
	j.mu.Unlock()
	if changed {
		j.e.setRebuildStatus(j.o.Replica, st)
	}
}

// targetOK checks T is still attached in WO mode: it may have failed a
// write, or been removed (the engine stopping removes every replica).
func (j *rebuildJob) targetOK() error {
	b, mode, ok := j.e.Backend(j.o.Replica)
	switch {
	case !ok || b != j.o.Target:
		return fmt.Errorf("replica %s was detached", j.o.Replica)
	case mode != ModeWO:
		return fmt.Errorf("replica %s is %s", j.o.Replica, mode)
	}
	return nil
}

// promote makes T RW, if it is still the WO replica the rebuild attached.
func (j *rebuildJob) promote() error {
	e := j.e
	e.mu.Lock()
	r := e.replicas[j.o.Replica]
	ok := r != nil && r.backend == j.o.Target && r.mode == ModeWO
	if ok {
		r.mode = ModeRW
	}
	e.mu.Unlock()
	if !ok {
		return j.targetOK()
	}
	return nil
}

// finish records how the rebuild ended and releases it. A failed rebuild
// leaves T in ERR.
func (j *rebuildJob) finish(err error) {
	e, o := j.e, j.o
	if err != nil {
		if j.dst != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = j.dst.Control(ctx, replicactl.ImportAbort, nil, nil)
			cancel()
		}
		if j.joined {
			e.mu.Lock()
			r := e.replicas[o.Replica]
			e.mu.Unlock()
			if r != nil && r.backend == o.Target {
				e.markERR(r, fmt.Errorf("rebuild: %w", err))
			}
		}
	}
	for _, c := range []Backend{j.src, j.dst} {
		if c != nil {
			_ = c.Close()
		}
	}
	j.mu.Lock()
	st := j.status
	j.mu.Unlock()
	st.IsRebuilding = false
	if err != nil {
		st.State, st.Error = RebuildError, err.Error()
		j.log.WithError(err).Warn("Rebuild failed")
	} else {
		st.State, st.Progress, st.Error, st.CopiedBytes = RebuildComplete, 100, "", j.copied
		elapsed := time.Since(j.began)
		j.log.WithFields(logrus.Fields{"bytes": j.total, "keptBytes": st.KeptBytes, "seconds": elapsed.Seconds(),
			"MBps": float64(j.total) / 1e6 / max(elapsed.Seconds(), 1e-9)}).Info("Rebuild complete; replica RW")
	}
	e.rb.mu.Lock()
	e.rb.active, e.rb.cancel = "", nil
	e.rb.mu.Unlock()
	e.setRebuildStatus(o.Replica, st)
	e.onChange()
}
