package imserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/nbd"
	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicaserver"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/atomicfile"
)

// instanceSpec is what an instance was created with. Replica specs are
// persisted so a restarted instance manager reopens its replicas.
type instanceSpec struct {
	Name             string            `json:"name"`
	Type             impb.InstanceType `json:"type"`
	VolumeName       string            `json:"volumeName"`
	Size             int64             `json:"size"`
	DataDir          string            `json:"dataDir,omitempty"`
	BackingFile      string            `json:"backingFile,omitempty"`
	Frontend         string            `json:"frontend,omitempty"`
	SnapshotMaxCount int32             `json:"snapshotMaxCount,omitempty"`
	SnapshotMaxSize  int64             `json:"snapshotMaxSize,omitempty"`
	Replicas         map[string]string `json:"replicas,omitempty"`
}

func (a instanceSpec) sameAs(b instanceSpec) bool {
	return a.Name == b.Name && a.Type == b.Type && a.VolumeName == b.VolumeName && a.Size == b.Size &&
		a.DataDir == b.DataDir && a.BackingFile == b.BackingFile && a.Frontend == b.Frontend &&
		maps.Equal(a.Replicas, b.Replicas)
}

// sameSpec tells whether a create request asks for this instance as it
// runs; the caller holds inst.mu. A replica an engine has expanded since
// matches both its recorded and its current size, so a manager retrying
// with either gets it back.
func (inst *instance) sameSpec(spec instanceSpec) bool {
	if inst.spec.sameAs(spec) {
		return true
	}
	if inst.rep == nil {
		return false
	}
	cur := inst.spec
	cur.Size = inst.rep.Size()
	return cur.sameAs(spec)
}

func specFromRequest(req *impb.InstanceCreateRequest) (instanceSpec, error) {
	spec := instanceSpec{Name: req.Name, Type: req.Type, VolumeName: req.VolumeName, Size: req.Size,
		DataDir: req.DataDir, BackingFile: req.BackingFile, Frontend: req.Frontend,
		SnapshotMaxCount: req.SnapshotMaxCount, SnapshotMaxSize: req.SnapshotMaxSize, Replicas: req.Replicas}
	// The name first: the errors below quote it.
	if err := checkName("name", req.Name); err != nil {
		return spec, err
	}
	if err := checkName("volume_name", req.VolumeName); err != nil {
		return spec, fmt.Errorf("instance %q: %w", req.Name, err)
	}
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("instance %q: %s: %w", req.Name, fmt.Sprintf(format, args...), engineapi.ErrInvalid)
	}
	if req.SnapshotMaxCount < 0 || req.SnapshotMaxSize < 0 {
		return spec, invalid("snapshot limits must not be negative")
	}
	for _, err := range []error{checkVolumeSize("size", req.Size), checkCount("replicas", len(req.Replicas), maxEngineReplicas)} {
		if err != nil {
			return spec, fmt.Errorf("instance %q: %w", req.Name, err)
		}
	}
	switch req.Type {
	case impb.InstanceType_INSTANCE_TYPE_REPLICA:
		// data_dir and backing_file: see confinement.replica.
	case impb.InstanceType_INSTANCE_TYPE_ENGINE:
		// An engine keeps no data: a path here would be unchecked and unused.
		if req.DataDir != "" || req.BackingFile != "" {
			return spec, invalid("data_dir and backing_file are for replicas; an engine keeps no data")
		}
		if req.Frontend != "" && req.Frontend != "nbd" {
			return spec, invalid("frontend %q is not nbd or empty", req.Frontend)
		}
	default:
		return spec, invalid("type %s is not engine or replica", req.Type)
	}
	return spec, nil
}

const specsFile = "replicas.json"

func loadSpecs(dir string) ([]instanceSpec, error) {
	data, err := os.ReadFile(filepath.Join(dir, specsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var specs []instanceSpec
	if err := json.Unmarshal(data, &specs); err != nil {
		return nil, fmt.Errorf("%s is damaged: %w", filepath.Join(dir, specsFile), err)
	}
	// The names are joined into paths again (FUSE files, NBD exports): the
	// file is the owner's only, but it is checked like a request, so a
	// name that could not have been created is never used.
	for i, spec := range specs {
		for _, f := range []struct{ field, v string }{{"name", spec.Name}, {"volumeName", spec.VolumeName}} {
			if err := checkName(f.field, f.v); err != nil {
				return nil, fmt.Errorf("%s is damaged: instance %d: %w", filepath.Join(dir, specsFile), i, err)
			}
		}
	}
	return specs, nil
}

// saveSpecs records the running replicas: a temp file, fsync, rename, and
// an fsync of the state directory, without which a crash could bring back
// the old list, and a created replica would not be reopened. One save at a
// time, so the last save sees the last state. The directory is the
// owner's only: the list names every replica's data directory.
func (s *Server) saveSpecs() error {
	s.specsMu.Lock()
	defer s.specsMu.Unlock()
	s.mu.Lock()
	var specs []instanceSpec
	for _, inst := range s.instances {
		if inst.spec.Type == impb.InstanceType_INSTANCE_TYPE_REPLICA {
			specs = append(specs, inst.spec)
		}
	}
	s.mu.Unlock()
	sort.Slice(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name })
	data, err := json.MarshalIndent(specs, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.MkdirAll(s.opts.StateDir, 0o700); err != nil {
		return fmt.Errorf("state directory %s: %w", s.opts.StateDir, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(s.opts.StateDir, specsFile), data); err != nil {
		return fmt.Errorf("saving the replicas: %w", err)
	}
	return nil
}

// checkCanCreate refuses to make a new, empty replica where one is expected
// or where its disk is not: on reopen the data should be there (a blank
// replica would pass for the lost one), and a data directory is
// <disk>/<dir>/<replica>, so a missing disk root means the disk is
// unmounted or moved — creating it would write onto the mount point.
func checkCanCreate(dataDir string, reopen bool) error {
	if reopen {
		return fmt.Errorf("replica data at %s is gone (%s missing)", dataDir, replica.MetaFile)
	}
	disk := filepath.Dir(filepath.Dir(dataDir))
	if st, err := os.Stat(disk); err != nil || !st.IsDir() {
		return fmt.Errorf("the disk of %s (%s) is not there: %w", dataDir, disk, errors.Join(err, errNotDir(st)))
	}
	return nil
}

func errNotDir(st os.FileInfo) error {
	if st != nil && !st.IsDir() {
		return errors.New("not a directory")
	}
	return nil
}

// startReplica opens (or creates) the replica's directory and serves it on
// a new dataconn listener. An existing replica smaller than the spec is
// expanded first (offline expansion: the manager recreates a stopped
// replica at the volume's new size). A larger one is refused, since volumes
// never shrink, unless reopen is set: then the spec is the instance
// manager's own record, which an engine's VolumeExpand does not update, so
// the size on disk wins.
func (s *Server) startReplica(inst *instance, reopen bool) error {
	spec := inst.spec
	var rep *replica.Replica
	var err error
	if _, statErr := os.Stat(filepath.Join(spec.DataDir, replica.MetaFile)); statErr == nil {
		rep, err = replica.OpenWithBackingFile(spec.DataDir, spec.BackingFile)
		if err == nil {
			err = s.fitReplicaSize(inst, rep, reopen)
			if err != nil {
				rep.Close()
				return err
			}
		}
	} else if err = checkCanCreate(spec.DataDir, reopen); err == nil {
		rep, err = replica.Create(spec.DataDir, spec.Size, replica.CreateOptions{BackingFile: spec.BackingFile})
	}
	if err != nil {
		return fmt.Errorf("replica %s: %w", spec.Name, err)
	}
	rep.SetLimits(int(spec.SnapshotMaxCount), spec.SnapshotMaxSize)
	l, err := net.Listen("tcp", net.JoinHostPort(s.opts.DataHost, "0"))
	if err != nil {
		rep.Close()
		return fmt.Errorf("replica %s: listening for data: %w", spec.Name, err)
	}
	log := s.log.WithField("replica", spec.Name)
	inst.rep, inst.handler = rep, replicaserver.New(rep, log)
	srv := dataconn.NewServer(inst.handler, log, s.dataServerOptions()...)
	inst.dcServer = srv
	inst.address = l.Addr().String()
	s.ownData.Store(inst.address, rep)
	// The goroutine keeps its own reference: a failed create clears
	// inst.dcServer (stopLocked) before the goroutine may have run.
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, dataconn.ErrServerClosed) {
			log.WithError(err).Error("Data connection server stopped")
		}
	}()
	inst.state, inst.err = impb.InstanceState_INSTANCE_STATE_RUNNING, ""
	log.WithFields(map[string]any{"dir": spec.DataDir, "address": inst.address}).Info("Replica started")
	return nil
}

// fitReplicaSize reconciles an opened replica's size with the spec (see
// startReplica).
func (s *Server) fitReplicaSize(inst *instance, rep *replica.Replica, reopen bool) error {
	spec, size := inst.spec, rep.Size()
	log := s.log.WithFields(map[string]any{"replica": spec.Name, "dir": spec.DataDir})
	switch {
	case size == spec.Size:
		return nil
	case size > spec.Size && reopen:
		log.WithFields(map[string]any{"recorded": spec.Size, "size": size}).Info("Replica was expanded; keeping its size")
		inst.spec.Size = size
		return nil
	case size > spec.Size:
		return fmt.Errorf("replica %s in %s has size %d, larger than the %d asked for; volumes do not shrink: %w",
			spec.Name, spec.DataDir, size, spec.Size, engineapi.ErrInvalid)
	}
	// The same call an engine's VolumeExpand makes on each replica.
	if err := rep.Expand(spec.Size); err != nil {
		return fmt.Errorf("replica %s in %s: expanding from %d to %d: %w", spec.Name, spec.DataDir, size, spec.Size, err)
	}
	log.WithFields(map[string]any{"from": size, "to": spec.Size}).Info("Replica expanded offline")
	return nil
}

// startEngine connects to the engine's replicas and starts its frontend.
// It starts if at least one replica connects: the volume is usable, and the
// others are listed in ERR (with the error in the instance's) so the
// manager replaces them as it does a replica that fails later. With none,
// it fails naming each replica's failure.
func (s *Server) startEngine(inst *instance, replicas map[string]string) error {
	spec := inst.spec
	if len(replicas) == 0 {
		return fmt.Errorf("engine %s: no replicas given: %w", spec.Name, engineapi.ErrInvalid)
	}
	log := s.log.WithField("engine", spec.Name)
	eng := replication.New(spec.VolumeName, spec.Size, log, func() { s.engineChanged(spec.Name) })
	names := make([]string, 0, len(replicas))
	for name := range replicas {
		names = append(names, name)
	}
	sort.Strings(names)
	// Dial in parallel: an unreachable node costs one dial timeout, not one
	// per replica, which would outlast the manager's call.
	clients := make([]*dataconn.Client, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { clients[i], errs[i] = s.dialReplicaConn(name, replicas[name]) })
	}
	wg.Wait()
	var failures []error
	for i, name := range names {
		if errs[i] == nil {
			if errs[i] = eng.AddReplica(name, replicas[name], clients[i], replication.ModeRW); errs[i] != nil {
				clients[i].Close()
			}
		}
		if errs[i] != nil {
			failures = append(failures, errs[i])
			_ = eng.AddFailedReplica(name, replicas[name], errs[i])
		}
	}
	if len(failures) == len(names) {
		stopEngine(eng)
		return fmt.Errorf("engine %s: no replica reachable: %w", spec.Name, errors.Join(failures...))
	}
	inst.eng = eng
	if spec.SnapshotMaxCount > 0 || spec.SnapshotMaxSize > 0 {
		if err := eng.SetLimits(context.Background(), int(spec.SnapshotMaxCount), spec.SnapshotMaxSize); err != nil {
			return err
		}
	}
	if spec.Frontend == "nbd" {
		if err := s.startFrontend(inst); err != nil {
			return err
		}
	}
	s.refreshChain(inst)
	inst.state = impb.InstanceState_INSTANCE_STATE_RUNNING
	if len(failures) > 0 {
		inst.err = errors.Join(failures...).Error()
	}
	log.WithFields(map[string]any{"replicas": len(names), "failed": len(failures)}).Info("Engine started")
	return nil
}

// stopEngine detaches every replica of an engine that never ran.
func stopEngine(eng *replication.Engine) {
	for _, r := range eng.Replicas() {
		_ = eng.RemoveReplica(r.Name)
	}
}

func (s *Server) dialReplicaConn(name, address string) (*dataconn.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dataconn.Dial(ctx, address, s.dataOptions(address, 30*time.Second))
	if err != nil {
		return nil, fmt.Errorf("replica %s at %s: %w", name, address, err)
	}
	return client, nil
}

func (s *Server) connectReplica(eng *replication.Engine, name, address string, mode replication.Mode) error {
	client, err := s.dialReplicaConn(name, address)
	if err != nil {
		return err
	}
	if err := eng.AddReplica(name, address, client, mode); err != nil {
		client.Close()
		return err
	}
	return nil
}

// startFrontend exports the engine over NBD under its volume's name. Two
// engines of one volume (a live migration) on this instance manager cannot
// both have it; the second is refused with ErrBusy until the first stops.
func (s *Server) startFrontend(inst *instance) error {
	volume := inst.spec.VolumeName
	s.mu.Lock()
	if owner, ok := s.exports[volume]; ok && owner != inst.spec.Name {
		s.mu.Unlock()
		return fmt.Errorf("engine %s: volume %s is already exported here by engine %s: %w", inst.spec.Name, volume, owner, engineapi.ErrBusy)
	}
	s.exports[volume] = inst.spec.Name
	s.mu.Unlock()
	if err := s.nbd.AddExport(volume, inst.eng); err != nil {
		s.releaseExport(inst)
		return fmt.Errorf("engine %s: NBD export: %w", inst.spec.Name, err)
	}
	// The same volume for clients that follow an online expansion (the CSI
	// node plugin's nbdfuse + loop device): see nbd.Growable.
	if err := s.nbd.AddExport(volume+engineapi.GrowableExportSuffix, inst.eng, nbd.Growable(engineapi.MaxVolumeSize)); err != nil {
		_ = s.nbd.RemoveExport(volume)
		s.releaseExport(inst)
		return fmt.Errorf("engine %s: growable NBD export: %w", inst.spec.Name, err)
	}
	inst.endpoint = engineapi.UnixNBDEndpoint(s.opts.NBDSocket, volume).String()
	if err := s.startFUSE(inst); err != nil {
		_ = s.stopFrontend(inst)
		return err
	}
	return nil
}

func (s *Server) releaseExport(inst *instance) {
	s.mu.Lock()
	if s.exports[inst.spec.VolumeName] == inst.spec.Name {
		delete(s.exports, inst.spec.VolumeName)
	}
	s.mu.Unlock()
}

func (s *Server) stopFrontend(inst *instance) error {
	if inst.endpoint == "" {
		return nil
	}
	inst.endpoint = ""
	err := errors.Join(s.stopFUSE(inst), s.nbd.RemoveExport(inst.spec.VolumeName),
		s.nbd.RemoveExport(inst.spec.VolumeName+engineapi.GrowableExportSuffix))
	s.releaseExport(inst)
	return err
}

// stopLocked stops whatever an instance runs; the caller holds inst.mu.
func (s *Server) stopLocked(inst *instance) error {
	var errs []error
	if inst.eng != nil {
		inst.eng.ThawAny() // writes a freeze holds must end before the frontend stops
		s.frozen.Delete(inst.spec.Name)
		s.stopJobs(inst.eng)
		errs = append(errs, s.stopFrontend(inst))
		for _, r := range inst.eng.Replicas() {
			errs = append(errs, inst.eng.RemoveReplica(r.Name))
		}
		inst.eng = nil
	}
	if inst.dcServer != nil {
		errs = append(errs, inst.dcServer.Close())
		inst.dcServer = nil
		s.ownData.Delete(inst.address)
	}
	if inst.handler != nil {
		inst.handler.Close()
		inst.handler = nil
	}
	if inst.rep != nil {
		errs = append(errs, inst.rep.Close())
		inst.rep = nil
	}
	inst.state = impb.InstanceState_INSTANCE_STATE_STOPPED
	return errors.Join(errs...)
}

// engineChanged publishes an engine's new replica modes (a replica marked
// ERR by a failed write, a rebuild's progress). The engine calls it from
// its I/O path, so it must not wait for the instance's lock.
func (s *Server) engineChanged(name string) {
	go func() {
		inst, err := s.get(name)
		if err != nil {
			return
		}
		inst.mu.Lock()
		defer inst.mu.Unlock()
		if inst.eng != nil {
			s.publishLocked(inst)
		}
	}()
}
