package imserver

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/backupstore"
)

// Backups and restores (issue 15) are jobs that outlive the call starting
// them: SnapshotBackup and BackupRestore check what they can at once, start
// the job and return; the job's progress and its end are in the engine
// instance's backup_status / restore_status, published on Watch at every
// whole percent, as a clone's are. One job runs per engine at a time.
//
// A backup reads the snapshot from one RW replica over connections of its
// own, exactly as export does (planSnapshot): only the layers' data extents
// are read, so holes are never read, and with a base snapshot only the
// extents of the layers after it ("Changed"): the rest of the volume comes
// from the base backup's manifest. Where no snapshot layer holds data and
// the replica has a backing file, the chunks are recorded as the backing
// image's (KindBacking), never read or uploaded.
//
// A restore writes through the target engine, so every replica gets the
// data, and refuses the frontend, snapshots and clones meanwhile (see
// cloneRunning).

// backupStatusTTL is how long an ended backup's status stays in the
// instance when no other backup of the engine replaces it: long enough for
// a manager that was restarting to see the end.
const backupStatusTTL = time.Hour

// dataJobs are the backup and restore jobs of the server's engines.
type dataJobs struct {
	mu       sync.Mutex
	backups  map[*replication.Engine]*backupJob
	restores map[*replication.Engine]*restoreJob
}

// jobStatus is what every job reports.
type jobStatus struct {
	cancel      context.CancelFunc
	done, total atomic.Int64

	mu    sync.Mutex
	state string // engineapi.JobState*
	err   string
	ended time.Time
}

func (j *jobStatus) percent() int32 {
	total := j.total.Load()
	if total <= 0 {
		return 0
	}
	return int32(min(j.done.Load()*100/total, 100))
}

func (j *jobStatus) running() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.state == engineapi.JobStateInProgress
}

func (j *jobStatus) failed() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.state == engineapi.JobStateError
}

func (j *jobStatus) finish(err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ended = time.Now()
	if err != nil {
		j.state, j.err = engineapi.JobStateError, err.Error()
		return
	}
	j.state = engineapi.JobStateCompleted
}

type backupJob struct {
	jobStatus
	backup, snapshot string

	// Set by the job, under mu.
	base, message, replica string
	header                 *backupstore.Header
}

func (j *backupJob) proto() *impb.BackupStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	st := &impb.BackupStatus{Snapshot: j.snapshot, State: j.state, Progress: j.percent(),
		BytesDone: j.done.Load(), BytesTotal: j.total.Load(), Error: j.err, BaseBackup: j.base,
		Message: j.message, Replica: j.replica}
	if h := j.header; h != nil {
		st.Progress = 100
		st.VolumeSize, st.ChunkSize = h.VolumeSize, h.ChunkSize
		st.DataChunks, st.BackingChunks, st.ReadChunks = h.Stats.DataChunks, h.Stats.BackingChunks, h.Stats.ReadChunks
		st.NewChunks, st.NewBytes, st.StoredBytes = h.Stats.NewChunks, h.Stats.NewBytes, h.Stats.StoredBytes
	}
	return st
}

// backupStatus renders eng's last backup, unless it ended long ago.
func (s *Server) backupStatus(eng *replication.Engine) map[string]*impb.BackupStatus {
	s.jobs.mu.Lock()
	j := s.jobs.backups[eng]
	s.jobs.mu.Unlock()
	if j == nil {
		return nil
	}
	j.mu.Lock()
	expired := !j.ended.IsZero() && time.Since(j.ended) > backupStatusTTL
	j.mu.Unlock()
	if expired {
		return nil
	}
	return map[string]*impb.BackupStatus{j.backup: j.proto()}
}

// stopJobs cancels the jobs of an engine that stops; the caller holds the
// instance's lock.
func (s *Server) stopJobs(eng *replication.Engine) {
	s.jobs.mu.Lock()
	defer s.jobs.mu.Unlock()
	if j := s.jobs.backups[eng]; j != nil {
		j.cancel()
		delete(s.jobs.backups, eng)
	}
	if j := s.jobs.restores[eng]; j != nil {
		j.cancel()
		delete(s.jobs.restores, eng)
	}
}

// jobRunning names the backup or restore running on eng, "" if none; the
// caller holds s.jobs.mu.
func (s *Server) jobRunningLocked(eng *replication.Engine) string {
	if j := s.jobs.backups[eng]; j != nil && j.running() {
		return "backup " + j.backup
	}
	if j := s.jobs.restores[eng]; j != nil && j.running() {
		return "restore of backup " + j.backup
	}
	return ""
}

// claimJob registers on eng the job newJob makes, in jobs (s.jobs.backups
// or s.jobs.restores), and returns it with the context its work runs in.
// It returns no job and no error when the job there is this request's
// (same) and has not failed — running or done, the manager retried — and
// ErrBusy while another backup, restore or clone runs on eng.
func claimJob[J interface{ failed() bool }](s *Server, jobs *map[*replication.Engine]J, eng *replication.Engine,
	engine string, same func(J) bool, newJob func(context.CancelFunc) J) (J, context.Context, error) {
	var none J
	s.jobs.mu.Lock()
	defer s.jobs.mu.Unlock()
	if old, ok := (*jobs)[eng]; ok && same(old) && !old.failed() {
		return none, nil, nil
	}
	if what := s.jobRunningLocked(eng); what != "" || s.cloneRunningOnly(eng) {
		if what == "" {
			what = "a clone"
		}
		return none, nil, engineapi.ToStatus(fmt.Errorf("engine %s: %s is running: %w", engine, what, engineapi.ErrBusy))
	}
	ctx, cancel := context.WithCancel(context.Background())
	job := newJob(cancel)
	if *jobs == nil {
		*jobs = map[*replication.Engine]J{}
	}
	(*jobs)[eng] = job
	return job, ctx, nil
}

// restoreRunning reports whether a restore is filling eng.
func (s *Server) restoreRunning(eng *replication.Engine) bool {
	s.jobs.mu.Lock()
	defer s.jobs.mu.Unlock()
	j := s.jobs.restores[eng]
	return j != nil && j.running()
}

// openStore opens the object store a request's target names. It makes no
// request to an S3 server; a file:// directory must exist and lie inside a
// backup path.
func (s *Server) openStore(t *impb.BackupTarget) (backupstore.ObjectStore, error) {
	if t.GetUrl() == "" {
		return nil, fmt.Errorf("backup target: url is empty: %w", engineapi.ErrInvalid)
	}
	if err := s.conf.backupTarget(t); err != nil {
		return nil, err
	}
	// The same parsing as the manager's BackupTarget controller, with the
	// credentials the request carries in the Secret's keys.
	st, err := backupstore.StoreFor(t.GetUrl(), map[string][]byte{
		backupstore.SecretEndpoint: []byte(t.GetS3Endpoint()), backupstore.SecretAccessKey: []byte(t.GetAccessKey()),
		backupstore.SecretSecretKey: []byte(t.GetSecretKey())})
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, engineapi.ErrInvalid)
	}
	return st, nil
}

// backupTarget opens a target once per identity (URL, endpoint and keys)
// and keeps it: a Target's chunk index is meant to be shared by every
// backup through it, and each backup syncs it (one List, and a GET of each
// index object not yet known) instead of reading every index object again.
func (s *Server) backupTarget(ctx context.Context, t *impb.BackupTarget, store backupstore.ObjectStore) (*backupstore.Target, error) {
	// Keyed by a hash: the keys are not kept as map keys in the clear.
	key := sha256.Sum256([]byte(strings.Join([]string{t.GetUrl(), t.GetS3Endpoint(), t.GetAccessKey(), t.GetSecretKey()}, "\x00")))
	if tgt := s.targets.get(key); tgt != nil {
		return tgt, nil
	}
	tgt, err := backupstore.Open(ctx, store, backupstore.Options{Logger: s.log.WithField("target", t.GetUrl())})
	if err != nil {
		return nil, err
	}
	return s.targets.add(key, tgt), nil
}

// maxCachedTargets bounds the targets kept open: each identity a request
// names (URL, endpoint, keys) would otherwise stay in memory for ever.
const maxCachedTargets = 16

// targetCache keeps the most recently used targets.
type targetCache struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]*cachedTarget
	tick    uint64
}

type cachedTarget struct {
	target *backupstore.Target
	used   uint64
}

func (c *targetCache) get(key [sha256.Size]byte) *backupstore.Target {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil {
		return nil
	}
	c.tick++
	e.used = c.tick
	return e.target
}

// add keeps tgt unless another was added for key meanwhile (that one is
// returned, so every backup shares one index), evicting the least
// recently used when full.
func (c *targetCache) add(key [sha256.Size]byte, tgt *backupstore.Target) *backupstore.Target {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[[sha256.Size]byte]*cachedTarget{}
	}
	c.tick++
	if e := c.entries[key]; e != nil {
		e.used = c.tick
		return e.target
	}
	if len(c.entries) >= maxCachedTargets {
		var oldest [sha256.Size]byte
		var oldestUsed uint64 = math.MaxUint64
		for k, e := range c.entries {
			if e.used < oldestUsed {
				oldest, oldestUsed = k, e.used
			}
		}
		delete(c.entries, oldest)
	}
	c.entries[key] = &cachedTarget{target: tgt, used: c.tick}
	return tgt
}

// SnapshotBackup starts a backup of a snapshot of an engine's volume and
// returns; the job is in the instance's backup_status. The same backup
// again while it runs or once it completed is a no-op (the manager
// retries); after it failed it starts over.
//
// Errors: empty arguments, a volume, backup or base_backup name that is
// not a DNS-1123 subdomain, a bad target URL, a volume on a backing file
// without backing_image are InvalidArgument; a missing snapshot NotFound;
// another backup or a restore running on the engine, a clone filling it
// Aborted (engineapi.ErrBusy). The rest — the target unreachable, the base
// backup missing (then the backup is full, and says so), a damaged
// replica — is reported in the status.
func (s *Server) SnapshotBackup(ctx context.Context, req *impb.SnapshotBackupRequest) (*impb.Empty, error) {
	for _, f := range []struct{ field, v string }{{"engine", req.Engine}, {"snapshot", req.Snapshot}} {
		if f.v == "" {
			return nil, engineapi.ToStatus(fmt.Errorf("%s is empty: %w", f.field, engineapi.ErrInvalid))
		}
	}
	if err := checkBackupNames(req.Volume, req.Backup, req.BaseBackup); err != nil {
		return nil, engineapi.ToStatus(err)
	}
	if req.Snapshot == replicactl.HeadName {
		return nil, engineapi.ToStatus(fmt.Errorf("%s is the live head, not a snapshot: %w", req.Snapshot, engineapi.ErrInvalid))
	}
	for _, err := range []error{checkLabels("labels", req.Labels), checkConcurrency("concurrency", req.Concurrency)} {
		if err != nil {
			return nil, engineapi.ToStatus(err)
		}
	}
	store, err := s.openStore(req.Target)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	inst, eng, err := s.runningEngine(req.Engine)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	chain, err := eng.Chain(ctx)
	if err != nil {
		return nil, engineapi.ToStatus(translate(fmt.Errorf("engine %s: reading the chain: %w", req.Engine, err)))
	}
	if _, ok := chain.Layers[req.Snapshot]; !ok {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s: snapshot %s: %w", req.Engine, req.Snapshot, engineapi.ErrNotFound))
	}
	if chain.Backing != nil && req.BackingImage.GetName() == "" {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s: the volume is on a backing file; backing_image is required: %w",
			req.Engine, engineapi.ErrInvalid))
	}

	job, jctx, err := claimJob(s, &s.jobs.backups, eng, req.Engine,
		func(old *backupJob) bool { return old.backup == req.Backup },
		func(cancel context.CancelFunc) *backupJob {
			j := &backupJob{backup: req.Backup, snapshot: req.Snapshot}
			j.cancel, j.state = cancel, engineapi.JobStateInProgress
			return j
		})
	if err != nil {
		return nil, err
	}
	if job == nil {
		return &impb.Empty{}, nil // running or done: the manager retried
	}

	log := s.log.WithFields(logrus.Fields{"engine": req.Engine, "snapshot": req.Snapshot, "backup": req.Backup,
		"volume": req.Volume, "target": req.Target.GetUrl()})
	s.publishClone(inst, eng)
	go func() {
		defer job.cancel()
		err := s.backup(jctx, inst, eng, store, req, job, log)
		if err != nil {
			err = fmt.Errorf("backup %s of snapshot %s of engine %s: %w", req.Backup, req.Snapshot, req.Engine, err)
			log.WithError(err).Warn("Snapshot backup failed")
		}
		job.finish(err)
		s.publishClone(inst, eng)
	}()
	return &impb.Empty{}, nil
}

// checkBackupNames checks the names a backup request makes object keys of,
// which on a file:// target are file and directory names (checkName);
// base, optional, only when given.
func checkBackupNames(volume, backup, base string) error {
	if err := checkName("volume", volume); err != nil {
		return err
	}
	if err := checkName("backup", backup); err != nil {
		return err
	}
	if base != "" {
		return checkName("base_backup", base)
	}
	return nil
}

func (s *Server) backup(ctx context.Context, inst *instance, eng *replication.Engine, store backupstore.ObjectStore,
	req *impb.SnapshotBackupRequest, job *backupJob, log logrus.FieldLogger) error {
	target, err := s.backupTarget(ctx, req.Target, store)
	if err != nil {
		return err
	}
	srcs, from, err := s.dialEngineReplica(ctx, eng)
	if err != nil {
		return err
	}
	defer closeAll(srcs)
	plan, err := planSnapshot(ctx, srcs[0], req.Snapshot, true)
	if err != nil {
		return err
	}
	job.mu.Lock()
	job.replica = from
	job.mu.Unlock()

	base, baseSnap, why := s.backupBase(ctx, target, req, plan)
	if why != "" {
		log.WithField("baseBackup", req.BaseBackup).Warn(why)
	}
	in := backupstore.BackupInput{
		Volume: req.Volume, Backup: req.Backup, Snapshot: req.Snapshot, Size: plan.volumeSize,
		Source:  newLayerReader(ctx, srcs, s.localLayers(eng, from), plan.pieces),
		Changed: changedRanges(plan, baseSnap),
		Base:    base, Labels: req.Labels, Concurrency: int(req.Concurrency),
	}
	if plan.backing != nil {
		in.Backing = backingRanges(plan, target.Format().ChunkSize)
		b := req.BackingImage
		in.BackingImage = &backupstore.BackingImage{Name: b.GetName(), URL: b.GetUrl(), Checksum: b.GetChecksum()}
	}
	job.mu.Lock()
	if base != nil {
		job.base = base.Backup
	}
	job.message = why
	job.mu.Unlock()

	var lastPct int32
	in.Progress = func(done, total int64) {
		job.done.Store(done)
		job.total.Store(total)
		if pct := job.percent(); pct != lastPct {
			lastPct = pct
			s.publishClone(inst, eng)
		}
	}
	log.WithFields(logrus.Fields{"replica": from, "base": job.base, "changed": len(in.Changed),
		"backing": len(in.Backing)}).Info("Snapshot backup started")
	m, err := target.Backup(ctx, in)
	if err != nil {
		return err
	}
	job.mu.Lock()
	job.header = &m.Header
	job.mu.Unlock()
	log.WithFields(logrus.Fields{"read": m.Stats.ReadChunks, "new": m.Stats.NewChunks, "newBytes": m.Stats.NewBytes,
		"backingChunks": m.Stats.BackingChunks}).Info("Snapshot backup complete")
	return nil
}

// backupBase loads the base backup and checks its snapshot is an ancestor
// of the one backed up. It returns the base and its snapshot, or nil and
// why the backup is full after all.
func (s *Server) backupBase(ctx context.Context, target *backupstore.Target, req *impb.SnapshotBackupRequest,
	plan *snapshotPlan) (*backupstore.Manifest, string, string) {
	if req.BaseBackup == "" {
		return nil, "", ""
	}
	base, err := target.LoadManifest(ctx, req.Volume, req.BaseBackup)
	if err != nil {
		return nil, "", fmt.Sprintf("base backup %s cannot be read (%v); full backup", req.BaseBackup, err)
	}
	if req.BaseSnapshot != "" && req.BaseSnapshot != base.Snapshot {
		return nil, "", fmt.Sprintf("base backup %s is of snapshot %s, not %s; full backup", req.BaseBackup, base.Snapshot, req.BaseSnapshot)
	}
	// The layers after the base's snapshot hold every change only if it is
	// on the path; a purged (coalesced) base snapshot is not.
	if !slices.Contains(plan.path, base.Snapshot) {
		return nil, "", fmt.Sprintf("base snapshot %s of backup %s is no longer in the chain below %s (purged?); full backup",
			base.Snapshot, req.BaseBackup, plan.snapshot)
	}
	return base, base.Snapshot, ""
}

// changedRanges are the extents of the path's layers above baseSnap, or of
// every snapshot layer without it: never nil, since nil means "read all".
func changedRanges(plan *snapshotPlan, baseSnap string) []backupstore.Range {
	out := []backupstore.Range{}
	for _, p := range deltaPieces(plan, baseSnap) {
		out = append(out, backupstore.Range{Offset: p.off, Length: p.length})
	}
	return out
}

// deltaPieces are the plan's pieces of the layers above baseSnap on its
// path (all its snapshot layers without one, never the backing file): what
// was written after baseSnap was taken. Incremental backups and
// SnapshotBlocks' delta both come from here.
func deltaPieces(plan *snapshotPlan, baseSnap string) []piece {
	above := map[string]bool{}
	for i := len(plan.path) - 1; i >= 0 && plan.path[i] != baseSnap; i-- {
		if plan.path[i] != replicactl.BackingName {
			above[plan.path[i]] = true
		}
	}
	var out []piece
	for _, p := range plan.pieces {
		if above[p.layer] {
			out = append(out, p)
		}
	}
	return out
}

// backingRanges are where the backing image shows through: the image's
// bytes rounded up to whole chunks (the image's partial last chunk reads
// zeros past its end on any copy of it), less what snapshot layers hold.
func backingRanges(plan *snapshotPlan, chunkSize int64) []backupstore.Range {
	var layers []replicactl.Extent
	for _, p := range plan.pieces {
		if p.layer != replicactl.BackingName {
			layers = append(layers, replicactl.Extent{Offset: p.off, Length: p.length})
		}
	}
	layers = normalizeExtents(layers, plan.volumeSize)
	end := min(plan.volumeSize, (plan.backing.Size+chunkSize-1)/chunkSize*chunkSize)
	var out []backupstore.Range
	for _, e := range subtractExtents([]replicactl.Extent{{Offset: 0, Length: end}}, layers) {
		out = append(out, backupstore.Range{Offset: e.Offset, Length: e.Length})
	}
	return out
}

// layerReader reads a snapshot (or a layer) at any offset from the pieces
// of a plan: what no piece covers is zero. It serves the backup's parallel
// workers over a few connections; each read-layer is a barrier on its own
// connection, so the connections are taken in turn. A replica this process
// serves (local) is read in place instead, in parallel and straight into
// the caller's buffer.
type layerReader struct {
	ctx    context.Context
	srcs   []*dataconn.Client
	local  *replica.Replica
	pieces []piece // sorted by offset, disjoint, each at most layerReadSize
	next   atomic.Uint32
}

func newLayerReader(ctx context.Context, srcs []*dataconn.Client, local *replica.Replica, pieces []piece) *layerReader {
	sorted := slices.Clone(pieces)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].off < sorted[j].off })
	return &layerReader{ctx: ctx, srcs: srcs, local: local, pieces: sorted}
}

// readPiece reads stop-start bytes of a layer at start into p.
func (r *layerReader) readPiece(layer string, p []byte, start int64) error {
	if r.local != nil {
		_, err := r.local.ReadLayer(layer, p, start)
		return err
	}
	src := r.srcs[int(r.next.Add(1))%len(r.srcs)]
	var data dataconn.Raw
	err := src.Control(r.ctx, replicactl.ReadLayer,
		replicactl.ReadLayerArgs{Layer: layer, Offset: start, Length: int64(len(p)), Raw: true}, &data)
	if err == nil && len(data) != len(p) {
		err = fmt.Errorf("read-layer returned %d bytes, asked for %d", len(data), len(p))
	}
	copy(p, data)
	return err
}

func (r *layerReader) ReadAt(p []byte, off int64) (int, error) {
	end := off + int64(len(p))
	filled := off // p is written up to here; what no piece covers is zero
	i := sort.Search(len(r.pieces), func(i int) bool { return r.pieces[i].off+r.pieces[i].length > off })
	for ; i < len(r.pieces) && r.pieces[i].off < end; i++ {
		pc := r.pieces[i]
		start, stop := max(off, pc.off), min(end, pc.off+pc.length)
		clear(p[filled-off : start-off])
		filled = stop
		if err := r.readPiece(pc.layer, p[start-off:stop-off], start); err != nil {
			return 0, fmt.Errorf("reading layer %s at %d: %w", pc.layer, start, err)
		}
	}
	clear(p[filled-off:])
	return len(p), nil
}

// cloneRunningOnly reports a SnapshotClone filling eng (cloneRunning also
// counts restores).
func (s *Server) cloneRunningOnly(eng *replication.Engine) bool {
	_, ok := s.clones.Load(eng)
	return ok
}
