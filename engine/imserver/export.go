package imserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// Snapshot export and clone both read a snapshot from one replica over
// data connections of their own: the snapshot's ancestry path (the snapshot
// and its parents down to the bottom of the chain, then the replica's
// backing file if it has one) is listed with the replica's extents control
// call and read with read-layer; the backing file goes by
// replicactl.BackingName there, reads zeros past its end, and is named in
// the chain reply's Backing, not among its layers. Connections of their own
// matter because control calls are barriers: on the engine's connection
// every read-layer would stall the volume's I/O.
//
// Only the part of each layer that no layer above it on the path covers is
// read ("visible" extents), so every byte of the snapshot is read once and
// the pieces never overlap. What no layer on the path holds reads as zeros.
//
// Snapshot layers are immutable, so no lock is held while reading. The one
// thing that changes them is a purge coalescing a removed ancestor R into
// its child C: R's blocks move into C's holes, or C's blocks are copied over
// R and C's image is replaced by R's. Either way, reading R at offsets C
// does not cover and C at C's offsets yields the same data before, during
// and after the merge, so a concurrent purge can only make the read fail
// (R's layer disappears), never return wrong data. A purge already running
// is refused up front (engineapi.ErrBusy) so that failure is rare. The
// backing file is read-only and never changes.

const (
	// exportChunkSize bounds the data of one ExportChunk.
	exportChunkSize = 1 << 20
	// layerReadSize is the data one read-layer call asks for; the replica
	// allows up to 4 MiB (its reply travels as JSON).
	layerReadSize = 4 << 20
	// dialTimeout bounds connecting to a replica.
	dialTimeout = 10 * time.Second
	// layerCallTimeout bounds each control call on a replica.
	layerCallTimeout = 60 * time.Second
	// layerReaders is how many connections read a snapshot's layers at once.
	layerReaders = 2
)

// piece is a range of one layer to read.
type piece struct {
	layer       string
	off, length int64
}

// snapshotPlan is what reading a snapshot takes.
type snapshotPlan struct {
	snapshot   string
	volumeSize int64
	backing    *replicactl.Backing // the replica's backing file, nil if none
	path       []string            // bottom first; replicactl.BackingName if read
	pieces     []piece             // bottom layer first; disjoint
	bytes      int64               // total length of pieces
}

// dialReplica opens data connections of our own to a replica: one, and up
// to layerReaders if the replica takes them.
func (s *Server) dialReplica(ctx context.Context, address string) ([]*dataconn.Client, error) {
	var srcs []*dataconn.Client
	for len(srcs) < layerReaders {
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		c, err := dataconn.Dial(dctx, address, s.dataOptions(address, layerCallTimeout))
		cancel()
		if err != nil {
			if len(srcs) == 0 {
				return nil, err
			}
			break
		}
		srcs = append(srcs, c)
	}
	return srcs, nil
}

func closeAll(srcs []*dataconn.Client) {
	for _, c := range srcs {
		c.Close()
	}
}

// ownReplica is the replica this process serves at address, nil if none.
func (s *Server) ownReplica(address string) *replica.Replica {
	if v, ok := s.ownData.Load(address); ok {
		return v.(*replica.Replica)
	}
	return nil
}

// localLayers is the replica named of eng when this process serves it, so
// its layers are read in process rather than over a connection to
// ourselves (three copies of every byte fewer); nil otherwise.
func (s *Server) localLayers(eng *replication.Engine, name string) *replica.Replica {
	for _, r := range eng.Replicas() {
		if r.Name == name {
			return s.ownReplica(r.Address)
		}
	}
	return nil
}

// dialEngineReplica connects to one RW replica of an engine, trying one
// this process serves first (its layers can be read in process:
// localLayers), then the others in name order.
func (s *Server) dialEngineReplica(ctx context.Context, eng *replication.Engine) ([]*dataconn.Client, string, error) {
	var errs []error
	replicas := eng.Replicas()
	rank := func(r replication.ReplicaStatus) int { // ours first
		if s.ownReplica(r.Address) != nil {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(replicas, func(a, b replication.ReplicaStatus) int { return cmp.Compare(rank(a), rank(b)) })
	for _, r := range replicas {
		if r.Mode != replication.ModeRW {
			continue
		}
		srcs, err := s.dialReplica(ctx, r.Address)
		if err == nil {
			return srcs, r.Name, nil
		}
		errs = append(errs, fmt.Errorf("replica %s: %w", r.Name, err))
	}
	if len(errs) == 0 {
		return nil, "", replication.ErrNoHealthyReplica
	}
	return nil, "", fmt.Errorf("%w: %w", replication.ErrNoHealthyReplica, errors.Join(errs...))
}

// runningEngine returns an engine instance and its engine, checked under
// the instance lock, which is not kept.
func (s *Server) runningEngine(name string) (*instance, *replication.Engine, error) {
	inst, err := s.getEngine(name)
	if err != nil {
		return nil, nil, err
	}
	inst.mu.Lock()
	eng := inst.eng
	inst.mu.Unlock()
	if eng == nil {
		return nil, nil, fmt.Errorf("engine %s stopped: %w", name, engineapi.ErrBusy)
	}
	return inst, eng, nil
}

// planSnapshot reads the chain of the replica behind src, checks the
// snapshot can be read and lists the pieces that make it up: with
// withBacking also what only the backing file holds, without it only what
// the snapshot layers hold.
func planSnapshot(ctx context.Context, src *dataconn.Client, snapshot string, withBacking bool) (*snapshotPlan, error) {
	if snapshot == replicactl.HeadName {
		return nil, fmt.Errorf("%s is the live head, not a snapshot: %w", snapshot, engineapi.ErrInvalid)
	}
	var chain replicactl.ChainReply
	if err := src.Control(ctx, replicactl.Chain, nil, &chain); err != nil {
		return nil, fmt.Errorf("reading the snapshot chain: %w", err)
	}
	l, ok := chain.Layers[snapshot]
	if !ok {
		return nil, fmt.Errorf("snapshot %s: %w", snapshot, engineapi.ErrNotFound)
	}
	if l.Removed {
		return nil, fmt.Errorf("snapshot %s is marked removed: %w", snapshot, engineapi.ErrInvalid)
	}
	var purge replicactl.PurgeStatusReply
	if err := src.Control(ctx, replicactl.PurgeStatus, nil, &purge); err != nil {
		return nil, fmt.Errorf("reading the purge status: %w", err)
	}
	if purge.IsPurging {
		return nil, fmt.Errorf("a purge is running on the replica; retry when it completes: %w", engineapi.ErrBusy)
	}
	if chain.VolumeSize <= 0 || chain.VolumeSize%blockdev.BlockSize != 0 {
		return nil, fmt.Errorf("replica reports volume size %d", chain.VolumeSize)
	}

	// The path, top first.
	var top []string
	for name := snapshot; name != ""; name = chain.Layers[name].Parent {
		if _, ok := chain.Layers[name]; !ok {
			return nil, fmt.Errorf("snapshot %s: parent %s is missing from the chain", snapshot, name)
		}
		if len(top) > len(chain.Layers) {
			return nil, fmt.Errorf("snapshot %s: the parent links form a cycle", snapshot)
		}
		top = append(top, name)
	}
	if withBacking && chain.Backing != nil {
		top = append(top, replicactl.BackingName)
	}

	plan := &snapshotPlan{snapshot: snapshot, volumeSize: chain.VolumeSize, backing: chain.Backing}
	visible := make([][]replicactl.Extent, len(top))
	var covered []replicactl.Extent
	for i, name := range top {
		var exts []replicactl.Extent
		if err := src.Control(ctx, replicactl.Extents, replicactl.NameArgs{Name: name}, &exts); err != nil {
			return nil, fmt.Errorf("extents of layer %s: %w", name, err)
		}
		exts = normalizeExtents(exts, chain.VolumeSize)
		visible[i] = subtractExtents(exts, covered)
		covered = unionExtents(covered, exts)
	}
	for i := len(top) - 1; i >= 0; i-- {
		plan.path = append(plan.path, top[i])
		for _, e := range visible[i] {
			for off := e.Offset; off < e.Offset+e.Length; off += layerReadSize {
				n := min(layerReadSize, e.Offset+e.Length-off)
				plan.pieces = append(plan.pieces, piece{layer: top[i], off: off, length: n})
				plan.bytes += n
			}
		}
	}
	return plan, nil
}

// normalizeExtents sorts extents, clips them to the volume and merges
// overlapping or adjacent ones, so the set operations below can trust them.
func normalizeExtents(exts []replicactl.Extent, size int64) []replicactl.Extent {
	slices.SortFunc(exts, func(a, b replicactl.Extent) int { return cmp.Compare(a.Offset, b.Offset) })
	out := exts[:0]
	for _, e := range exts {
		start, end := max(e.Offset, 0), min(e.Offset+e.Length, size)
		if end <= start {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Offset+out[n-1].Length >= start {
			out[n-1].Length = max(out[n-1].Offset+out[n-1].Length, end) - out[n-1].Offset
			continue
		}
		out = append(out, replicactl.Extent{Offset: start, Length: end - start})
	}
	return out
}

// subtractExtents returns the parts of a that b does not cover; both are
// normalized.
func subtractExtents(a, b []replicactl.Extent) []replicactl.Extent {
	var out []replicactl.Extent
	j := 0
	for _, e := range a {
		start, end := e.Offset, e.Offset+e.Length
		for j < len(b) && b[j].Offset+b[j].Length <= start {
			j++
		}
		for k := j; k < len(b) && b[k].Offset < end; k++ {
			if b[k].Offset > start {
				out = append(out, replicactl.Extent{Offset: start, Length: b[k].Offset - start})
			}
			start = max(start, b[k].Offset+b[k].Length)
		}
		if start < end {
			out = append(out, replicactl.Extent{Offset: start, Length: end - start})
		}
	}
	return out
}

// unionExtents merges two normalized extent lists.
func unionExtents(a, b []replicactl.Extent) []replicactl.Extent {
	all := make([]replicactl.Extent, 0, len(a)+len(b))
	all = append(append(all, a...), b...)
	return normalizeExtents(all, 1<<62)
}

// readPieces reads the plan's pieces and gives fn the data of each, in
// order. Pieces are fetched over every connection in srcs at once (a
// control call is a barrier on its connection, so one connection reads one
// piece at a time), a little ahead of fn.
func readPieces(ctx context.Context, srcs []*dataconn.Client, pieces []piece, fn func(p piece, data []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	type result struct {
		data []byte
		err  error
	}
	// Worker w reads pieces w, w+k, w+2k... into its own channel, so taking
	// the channels in turn gives the pieces in order.
	k := len(srcs)
	chans := make([]chan result, k)
	var wg sync.WaitGroup
	for w, src := range srcs {
		ch := make(chan result, 1)
		chans[w] = ch
		wg.Go(func() {
			defer close(ch)
			for i := w; i < len(pieces); i += k {
				p := pieces[i]
				// Raw: the bytes as they are, not base64 in JSON.
				var data dataconn.Raw
				err := src.Control(ctx, replicactl.ReadLayer,
					replicactl.ReadLayerArgs{Layer: p.layer, Offset: p.off, Length: p.length, Raw: true}, &data)
				if err == nil && int64(len(data)) != p.length {
					err = fmt.Errorf("read-layer returned %d bytes, asked for %d", len(data), p.length)
				}
				if err != nil {
					err = fmt.Errorf("reading layer %s at %d: %w", p.layer, p.off, err)
				}
				select {
				case ch <- result{data, err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		})
	}
	defer func() {
		cancel()
		for _, ch := range chans { // let the workers finish before the caller closes srcs
			for range ch {
			}
		}
		wg.Wait()
	}()
	for i, p := range pieces {
		r, ok := <-chans[i%k]
		if !ok {
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("piece %d of %d went missing", i, len(pieces))
		}
		if r.err != nil {
			return r.err
		}
		if err := fn(p, r.data); err != nil {
			return err
		}
	}
	return nil
}

// progressLog logs a long copy about every 10% and at most every few
// seconds.
type progressLog struct {
	log      logrus.FieldLogger
	what     string
	total    int64
	done     int64
	started  time.Time
	lastPct  int64
	lastTime time.Time
}

func newProgressLog(log logrus.FieldLogger, what string, total int64) *progressLog {
	now := time.Now()
	return &progressLog{log: log, what: what, total: total, started: now, lastTime: now}
}

func (p *progressLog) add(n int64) {
	p.done += n
	pct := int64(100)
	if p.total > 0 {
		pct = p.done * 100 / p.total
	}
	if pct/10 > p.lastPct/10 || time.Since(p.lastTime) > 10*time.Second {
		p.lastPct, p.lastTime = pct, time.Now()
		p.log.WithFields(logrus.Fields{"progress": pct, "bytes": p.done, "total": p.total}).Info(p.what + " in progress")
	}
}

func (p *progressLog) finish(written int64) {
	secs := time.Since(p.started).Seconds()
	p.log.WithFields(logrus.Fields{"bytes": p.total, "written": written, "seconds": fmt.Sprintf("%.2f", secs),
		"MBps": fmt.Sprintf("%.1f", float64(p.total)/1e6/max(secs, 1e-9))}).Info(p.what + " complete")
}

// SnapshotExport streams the data of a snapshot of an engine's volume as it
// was when the snapshot was taken, read from one RW replica.
//
// Stream contract: the first chunk carries volume_size (a snapshot without
// data is one empty chunk at offset 0). A client starts from a zeroed image
// of volume_size bytes and writes every chunk's data at its offset, in the
// order received; a later chunk overrides earlier ones at the same offsets,
// and bytes no chunk covers are zero. (This server never sends overlapping
// chunks, but clients must not rely on it.) Each chunk holds at most 1 MiB
// of data. If the stream ends with an error, what was received is
// incomplete and must be discarded. A volume over a backing file is sent
// whole: the image's data where no snapshot layer overrides it.
//
// Errors: an unknown snapshot is NotFound, the head or a removed snapshot is
// InvalidArgument, a purge running on the replica or a clone running into
// the engine is Aborted (engineapi.ErrBusy). No instance or engine lock is
// held while streaming.
func (s *Server) SnapshotExport(req *impb.SnapshotExportRequest, stream impb.InstanceManager_SnapshotExportServer) error {
	ctx := stream.Context()
	if req.Snapshot == "" {
		return engineapi.ToStatus(fmt.Errorf("snapshot name is empty: %w", engineapi.ErrInvalid))
	}
	_, eng, err := s.runningEngine(req.Engine)
	if err != nil {
		return engineapi.ToStatus(err)
	}
	if s.cloneRunning(eng) {
		return engineapi.ToStatus(fmt.Errorf("engine %s: a clone into it is running: %w", req.Engine, engineapi.ErrBusy))
	}
	fail := func(err error) error {
		return engineapi.ToStatus(translate(fmt.Errorf("export snapshot %s of engine %s: %w", req.Snapshot, req.Engine, err)))
	}
	srcs, from, err := s.dialEngineReplica(ctx, eng)
	if err != nil {
		return fail(err)
	}
	defer closeAll(srcs)
	plan, err := planSnapshot(ctx, srcs[0], req.Snapshot, true)
	if err != nil {
		return fail(err)
	}
	log := s.log.WithFields(logrus.Fields{"engine": req.Engine, "snapshot": req.Snapshot, "replica": from})
	log.WithFields(logrus.Fields{"layers": len(plan.path), "bytes": plan.bytes}).Info("Snapshot export started")
	progress := newProgressLog(log, "Snapshot export", plan.bytes)

	first := true
	var sent int64
	send := func(off int64, data []byte) error {
		chunk := &impb.ExportChunk{Offset: off, Data: data}
		if first {
			chunk.VolumeSize, first = plan.volumeSize, false
		}
		sent += int64(len(data))
		return stream.Send(chunk)
	}
	err = readPieces(ctx, srcs, plan.pieces, func(p piece, data []byte) error {
		for off := p.off; len(data) > 0; {
			n := min(len(data), exportChunkSize)
			if err := send(off, data[:n]); err != nil {
				return err
			}
			off, data = off+int64(n), data[n:]
		}
		progress.add(p.length)
		return nil
	})
	if err != nil {
		log.WithError(err).Warn("Snapshot export failed")
		return fail(err)
	}
	if first {
		if err := send(0, nil); err != nil {
			return fail(err)
		}
	}
	progress.finish(sent)
	return nil
}
