// Package imserver is the instance manager of one node: it runs the node's
// engine and replica instances as goroutines, serves the instance-manager
// gRPC API to the managers, dataconn to engines, and NBD to clients. It
// imports no Kubernetes client or API types; names it turns into paths are
// checked with apimachinery's DNS-1123 validation (checkName).
package imserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/fusefile"
	"github.com/strata-storage/strata/engine/nbd"
	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicaserver"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/fsfreeze"
	"github.com/strata-storage/strata/internal/pki"
)

// Options configure a Server.
type Options struct {
	// StateDir holds the instance manager's own state: the replica
	// instances to reopen after a restart.
	StateDir string
	// DiskPaths are the directories the instance manager may keep replica
	// data in and read backing files from: the node's disks, or directories
	// holding them. Every path a request names for replica data must lie
	// inside one (see confine.go); at least one is required.
	DiskPaths []string
	// BackupPaths are the directories file:// backup targets may lie in
	// (NFS mounts); none refuses file:// targets.
	BackupPaths []string
	// DataHost is the address replicas' dataconn listeners bind to and
	// advertise (an IP engines on other nodes can reach).
	DataHost string
	// NBDSocket is the unix socket (an absolute path) the NBD frontend is
	// served on, as frontend endpoints name it:
	// nbd+unix:///<volume>?socket=<NBDSocket>. Requests may not name it
	// (see confine.go). Required.
	NBDSocket string
	// DataServerTLS and DataClientTLS authenticate data connections (the
	// replicas' listeners, and the engines, rebuilds and clones that dial
	// them): peers must be instance managers of the cluster's CA. Nil speaks
	// plain TCP, which only tests do.
	DataServerTLS, DataClientTLS *tls.Config
	// TLSDir is where the certificates are read from (--tls-dir): the
	// instance manager's own, refused in requests like StateDir.
	TLSDir string
	// DataUnencrypted carries data connections' frames in the clear after
	// the mutual-TLS handshake (dataconn.Options.Unencrypted).
	DataUnencrypted bool
	// SizeReportInterval is how often running engines' chain sizes (which
	// grow with writes) are re-read and, if they changed, published to
	// watchers; 0 means DefaultSizeReportInterval, negative turns it off.
	// Writes themselves never publish (see sizereport.go).
	SizeReportInterval time.Duration
	// FUSEDir, when set (an absolute path), is where each exported volume
	// is also served as a file, FUSEDir/<volume>/disk (engine/fusefile),
	// beside its NBD export: a loop device on it skips the NBD hop that
	// costs the node path (docs/bench-kbench.md). Empty: NBD only.
	FUSEDir string
	// FSFreezeSocket is the node CSI plugin's freeze socket (fsfreeze.go);
	// empty: snapshots are never cut inside a filesystem freeze.
	FSFreezeSocket string
	Log            logrus.FieldLogger
}

// Server is one node's instance manager.
type Server struct {
	impb.UnimplementedInstanceManagerServer

	opts Options
	log  logrus.FieldLogger
	conf confinement
	hub  *hub
	nbd  *nbd.Server

	mu        sync.Mutex
	specsMu   sync.Mutex // serializes saveSpecs
	instances map[string]*instance
	revision  uint64
	// deleting holds the data directories ReplicaDataDelete is removing,
	// so no replica instance is created in one meanwhile.
	deleting map[string]bool
	// exports maps a volume to the engine serving its NBD export: the
	// export is named after the volume, so during a live migration only
	// one of two engines of a volume on this node may have the frontend.
	exports map[string]string
	// ownData maps the data address of each replica this process serves
	// to it (*replica.Replica; see dataOptions and ownReplica).
	ownData sync.Map

	// frozen holds the engines frozen for a group cut, by name, so a thaw
	// reaches one without its instance lock (freeze.go).
	frozen sync.Map
	// fsFreezer asks the node's CSI plugin to freeze filesystems (nil:
	// none), and fsCuts remembers what a group cut's freeze gave each
	// engine, by engine/cut (fsfreeze.go).
	fsFreezer fsFreezer
	fsCuts    sync.Map
	// clones holds the engines a SnapshotClone is filling (see clone.go).
	clones sync.Map
	// jobs holds the engines' backups and restores (see backup.go).
	jobs dataJobs
	// targets holds the backup targets opened for backups, by identity, so
	// their chunk index is synced, not read again whole, per backup.
	targets targetCache

	// The size reporter (sizereport.go): stop ends it, wg waits for it.
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	// sizeReads counts chain reads by the size reporter, so tests can see
	// that an idle engine costs none.
	sizeReads atomic.Uint64
}

type instance struct {
	mu   sync.Mutex // serializes operations on this instance
	spec instanceSpec

	state impb.InstanceState
	err   string

	// replica instances
	rep      *replica.Replica
	handler  *replicaserver.Handler
	dcServer *dataconn.Server
	address  string

	// engine instances
	eng       *replication.Engine
	endpoint  string
	fuse      *fusefile.Server // the volume as a file, with FUSEDir
	snapshots map[string]*impb.Snapshot
	// chainGen counts updates of snapshots, so the size reporter, which
	// reads the chain without the lock, never overwrites a newer chain.
	chainGen uint64
	// reportedVersion is the engine's DataVersion the cached sizes reflect.
	reportedVersion uint64
	// chainStale: a purge ended after the cached chain was read.
	chainStale bool
	// roundVersion is the DataVersion the size reporter saw last round and
	// busyRounds the rounds it has skipped reading a busy engine (busyWait).
	roundVersion uint64
	busyRounds   int
	// purging is set by SnapshotPurge and cleared once no replica reports
	// a purge running; meanwhile the size reporter follows it.
	purging bool
	purge   map[string]*impb.PurgeStatus
	// refreshing is set while the size reporter reads this engine, so a
	// slow replica never piles up reads.
	refreshing atomic.Bool

	// published is the rendering last sent to watchers (no revision), so
	// nothing is sent twice.
	published *impb.Instance
}

// New builds a server and reopens the replicas recorded in StateDir.
func New(opts Options) (*Server, error) {
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	if opts.SizeReportInterval == 0 {
		opts.SizeReportInterval = DefaultSizeReportInterval
	}
	switch p := opts.NBDSocket; {
	case p == "":
		return nil, errors.New("no NBD socket: engines would have no endpoint; give one (--nbd-socket)")
	case !filepath.IsAbs(p) || hasDotDot(p):
		return nil, fmt.Errorf("--nbd-socket %q: must be an absolute path without ..", p)
	}
	if p := opts.FUSEDir; p != "" && (!filepath.IsAbs(p) || hasDotDot(p)) {
		return nil, fmt.Errorf("--fuse-dir %q: must be an absolute path without ..", p)
	}
	conf, err := newConfinement(opts)
	if err != nil {
		return nil, err
	}
	if err := cleanStaleFUSE(opts.FUSEDir, opts.Log); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Log.WithField("component", "instance-manager"), conf: conf, hub: newHub(),
		instances: map[string]*instance{}, deleting: map[string]bool{}, exports: map[string]string{},
		stop: make(chan struct{})}
	s.nbd = nbd.NewServer(nbd.Options{Logger: opts.Log})
	if opts.FSFreezeSocket != "" {
		s.fsFreezer = fsfreeze.NewClient(opts.FSFreezeSocket)
	}
	specs, err := loadSpecs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	resized := false
	for _, spec := range specs {
		inst := &instance{spec: spec}
		// A record from before the disks were confined, or with a disk no
		// longer given, stays listed in ERROR and its data untouched.
		err := s.conf.replica(spec)
		if err == nil {
			err = s.startReplica(inst, true)
		}
		if err != nil {
			// Keep it listed in ERROR so the manager sees what happened.
			inst.state, inst.err = impb.InstanceState_INSTANCE_STATE_ERROR, err.Error()
			s.log.WithError(err).WithField("replica", spec.Name).Error("Cannot reopen replica")
		}
		resized = resized || inst.spec.Size != spec.Size
		// Watchers get this state when they subscribe; the size reporter
		// must not send it again as if it were news.
		inst.published = s.render(inst)
		s.instances[spec.Name] = inst
	}
	if len(specs) > 0 {
		s.log.WithField("replicas", len(specs)).Info("Reopened replicas from disk")
	}
	if resized {
		if err := s.saveSpecs(); err != nil {
			s.log.WithError(err).Warn("Cannot record the replicas' new sizes")
		}
	}
	if opts.SizeReportInterval > 0 {
		s.wg.Add(1)
		go s.reportSizes(opts.SizeReportInterval)
	}
	return s, nil
}

// ServeNBD serves the NBD frontend on l until Close.
func (s *Server) ServeNBD(l net.Listener) error { return s.nbd.Serve(l) }

// Close stops every instance (replicas are closed cleanly, their data stays)
// and the NBD server.
func (s *Server) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.mu.Lock()
	insts := make([]*instance, 0, len(s.instances))
	for _, inst := range s.instances {
		insts = append(insts, inst)
	}
	s.mu.Unlock()
	var errs []error
	for _, inst := range insts {
		inst.mu.Lock()
		errs = append(errs, s.stopLocked(inst))
		inst.mu.Unlock()
	}
	errs = append(errs, s.nbd.Close())
	return errors.Join(errs...)
}

func (s *Server) get(name string) (*instance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[name]
	if !ok {
		return nil, fmt.Errorf("instance %s: %w", name, engineapi.ErrNotFound)
	}
	return inst, nil
}

func (s *Server) getEngine(name string) (*instance, error) {
	inst, err := s.get(name)
	if err != nil {
		return nil, err
	}
	if inst.spec.Type != impb.InstanceType_INSTANCE_TYPE_ENGINE {
		return nil, fmt.Errorf("instance %s is not an engine: %w", name, engineapi.ErrInvalid)
	}
	inst.mu.Lock()
	running := inst.eng != nil
	inst.mu.Unlock()
	if !running {
		return nil, fmt.Errorf("engine %s is not running: %w", name, engineapi.ErrBusy)
	}
	return inst, nil
}

// InstanceCreate starts a replica or an engine. Creating an instance that
// exists with the same spec returns it (managers retry); a different spec
// is an AlreadyExists error.
func (s *Server) InstanceCreate(_ context.Context, req *impb.InstanceCreateRequest) (*impb.Instance, error) {
	spec, err := specFromRequest(req)
	if err == nil && spec.Type == impb.InstanceType_INSTANCE_TYPE_REPLICA {
		err = s.conf.replica(spec)
	}
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	s.mu.Lock()
	if old, ok := s.instances[spec.Name]; ok {
		s.mu.Unlock()
		old.mu.Lock()
		defer old.mu.Unlock()
		if !old.sameSpec(spec) {
			return nil, engineapi.ToStatus(fmt.Errorf("instance %s exists with another spec: %w", spec.Name, engineapi.ErrAlreadyExists))
		}
		return s.toProto(old), nil
	}
	if spec.Type == impb.InstanceType_INSTANCE_TYPE_REPLICA {
		if err := s.dirFreeLocked(spec.Name, spec.DataDir); err != nil {
			s.mu.Unlock()
			return nil, engineapi.ToStatus(err)
		}
	}
	inst := &instance{spec: spec, state: impb.InstanceState_INSTANCE_STATE_STARTING}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	s.instances[spec.Name] = inst
	s.mu.Unlock()

	switch spec.Type {
	case impb.InstanceType_INSTANCE_TYPE_REPLICA:
		err = s.startReplica(inst, false)
		if err == nil {
			err = s.saveSpecs()
		}
	case impb.InstanceType_INSTANCE_TYPE_ENGINE:
		err = s.startEngine(inst, req.Replicas)
	}
	if err != nil {
		_ = s.stopLocked(inst)
		s.mu.Lock()
		delete(s.instances, spec.Name)
		s.mu.Unlock()
		return nil, engineapi.ToStatus(err)
	}
	s.publishLocked(inst)
	return s.toProto(inst), nil
}

// InstanceDelete stops an instance. A replica's data stays on disk.
func (s *Server) InstanceDelete(_ context.Context, ref *impb.InstanceRef) (*impb.Instance, error) {
	inst, err := s.get(ref.Name)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	err = s.stopLocked(inst)
	s.mu.Lock()
	delete(s.instances, ref.Name)
	s.mu.Unlock()
	if inst.spec.Type == impb.InstanceType_INSTANCE_TYPE_REPLICA {
		err = errors.Join(err, s.saveSpecs())
	}
	out := s.toProto(inst)
	out.State = impb.InstanceState_INSTANCE_STATE_STOPPED
	s.revisionBump(out)
	s.hub.publish(impb.WatchEvent_KIND_DELETED, out)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	return out, nil
}

// InstanceGet returns one instance.
func (s *Server) InstanceGet(_ context.Context, ref *impb.InstanceRef) (*impb.Instance, error) {
	inst, err := s.get(ref.Name)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return s.toProto(inst), nil
}

// InstanceList returns every instance, sorted by name.
func (s *Server) InstanceList(context.Context, *impb.InstanceListRequest) (*impb.InstanceListResponse, error) {
	return &impb.InstanceListResponse{Instances: s.current()}, nil
}

func (s *Server) current() []*impb.Instance {
	s.mu.Lock()
	insts := make([]*instance, 0, len(s.instances))
	for _, inst := range s.instances {
		insts = append(insts, inst)
	}
	s.mu.Unlock()
	out := make([]*impb.Instance, 0, len(insts))
	for _, inst := range insts {
		inst.mu.Lock()
		out = append(out, s.toProto(inst))
		inst.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Watch sends the current state of every instance, then every change.
func (s *Server) Watch(_ *impb.WatchRequest, stream impb.InstanceManager_WatchServer) error {
	sub := s.hub.subscribe(s.current())
	defer s.hub.unsubscribe(sub)
	// The current state, then the marker that the watcher is up to date.
	initial := append(sub.drain(), &impb.WatchEvent{Kind: impb.WatchEvent_KIND_SYNCED})
	for _, ev := range initial {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	for {
		evs, err := sub.next(stream.Context())
		if err != nil {
			return nil // the watcher went away
		}
		for _, ev := range evs {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}

// publishLocked sends an instance's state to watchers if it differs from
// what they were last sent, so callers can publish after anything that may
// have changed it and watchers only hear of real changes; the caller holds
// inst.mu.
func (s *Server) publishLocked(inst *instance) {
	cur := s.render(inst)
	if inst.published != nil && proto.Equal(cur, inst.published) {
		return
	}
	inst.published = cur
	out := proto.Clone(cur).(*impb.Instance)
	s.revisionBump(out)
	s.hub.publish(impb.WatchEvent_KIND_UPDATED, out)
}

func (s *Server) revisionBump(out *impb.Instance) {
	s.mu.Lock()
	s.revision++
	out.Revision = s.revision
	s.mu.Unlock()
}

// toProto renders an instance with a new revision; the caller holds inst.mu.
func (s *Server) toProto(inst *instance) *impb.Instance {
	out := s.render(inst)
	s.revisionBump(out)
	return out
}

// render renders an instance without a revision, so two renderings can be
// compared; the caller holds inst.mu.
func (s *Server) render(inst *instance) *impb.Instance {
	out := &impb.Instance{
		Name: inst.spec.Name, Type: inst.spec.Type, VolumeName: inst.spec.VolumeName, Size: inst.spec.Size,
		State: inst.state, Error: inst.err, Address: inst.address, FrontendEndpoint: inst.endpoint,
	}
	if inst.rep != nil {
		// An engine's VolumeExpand grows the replica behind this instance's back.
		out.Size = inst.rep.Size()
	}
	if inst.eng != nil {
		out.Size = inst.eng.Size()
		out.ReplicaModes = map[string]impb.ReplicaMode{}
		for _, r := range inst.eng.Replicas() {
			out.ReplicaModes[r.Name] = modeToProto(r.Mode)
		}
		out.Snapshots = map[string]*impb.Snapshot{}
		for name, snap := range inst.snapshots {
			out.Snapshots[name] = proto.Clone(snap).(*impb.Snapshot)
		}
		out.RebuildStatus = rebuildStatusProto(inst.eng)
		out.CloneStatus = s.cloneStatus(inst.eng)
		out.BackupStatus = s.backupStatus(inst.eng)
		out.RestoreStatus = s.restoreStatus(inst.eng)
		if len(inst.purge) > 0 {
			out.PurgeStatus = map[string]*impb.PurgeStatus{}
			for name, st := range inst.purge {
				out.PurgeStatus[name] = proto.Clone(st).(*impb.PurgeStatus)
			}
		}
	}
	return out
}

func modeToProto(m replication.Mode) impb.ReplicaMode {
	switch m {
	case replication.ModeRW:
		return impb.ReplicaMode_REPLICA_MODE_RW
	case replication.ModeWO:
		return impb.ReplicaMode_REPLICA_MODE_WO
	case replication.ModeERR:
		return impb.ReplicaMode_REPLICA_MODE_ERR
	}
	return impb.ReplicaMode_REPLICA_MODE_UNSPECIFIED
}

// dataOptions are the options of a data connection this instance manager
// dials to address (a replica, for an engine, a rebuild, a clone or an
// export). A connection to a replica this process serves is authenticated
// but not encrypted: its bytes never leave the process's own loopback
// traffic, and a 1-replica volume would otherwise pay for encryption twice
// per byte for nothing.
func (s *Server) dataOptions(address string, timeout time.Duration) dataconn.Options {
	_, own := s.ownData.Load(address)
	// The replica's instance manager must show a certificate issued for
	// address: another node's is refused (pki.ForAddress).
	return dataconn.Options{Timeout: timeout, Log: s.log, TLS: pki.ForAddress(s.opts.DataClientTLS, address),
		Unencrypted: s.opts.DataUnencrypted || own}
}

// dataServerOptions are a replica's data listener's.
func (s *Server) dataServerOptions() []dataconn.ServerOption {
	if s.opts.DataServerTLS == nil {
		return nil
	}
	return []dataconn.ServerOption{dataconn.WithTLS(s.opts.DataServerTLS)}
}
