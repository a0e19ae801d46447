// Package imserver is the instance manager of one node: it runs the node's
// engine and replica instances as goroutines, serves the instance-manager
// gRPC API to the managers, dataconn to engines, and NBD to clients. It has
// no Kubernetes imports.
package imserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/nbd"
	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicaserver"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// Options configure a Server.
type Options struct {
	// StateDir holds the instance manager's own state: the replica
	// instances to reopen after a restart.
	StateDir string
	// DataHost is the address replicas' dataconn listeners bind to and
	// advertise (an IP engines on other nodes can reach).
	DataHost string
	// NBDAddress is where clients reach the NBD frontend, host:port, as
	// advertised in frontend endpoints.
	NBDAddress string
	Log        logrus.FieldLogger
}

// Server is one node's instance manager.
type Server struct {
	impb.UnimplementedInstanceManagerServer

	opts Options
	log  logrus.FieldLogger
	hub  *hub
	nbd  *nbd.Server

	mu        sync.Mutex
	instances map[string]*instance
	revision  uint64

	// clones holds the engines a SnapshotClone is filling (see clone.go).
	clones sync.Map
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
	snapshots map[string]*impb.Snapshot
}

// New builds a server and reopens the replicas recorded in StateDir.
func New(opts Options) (*Server, error) {
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	s := &Server{opts: opts, log: opts.Log.WithField("component", "instance-manager"), hub: newHub(),
		instances: map[string]*instance{}}
	s.nbd = nbd.NewServer(nbd.Options{Logger: opts.Log})
	specs, err := loadSpecs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	for _, spec := range specs {
		inst := &instance{spec: spec}
		if err := s.startReplica(inst); err != nil {
			// Keep it listed in ERROR so the manager sees what happened.
			inst.state, inst.err = impb.InstanceState_INSTANCE_STATE_ERROR, err.Error()
			s.log.WithError(err).WithField("replica", spec.Name).Error("Cannot reopen replica")
		}
		s.instances[spec.Name] = inst
	}
	if len(specs) > 0 {
		s.log.WithField("replicas", len(specs)).Info("Reopened replicas from disk")
	}
	return s, nil
}

// ServeNBD serves the NBD frontend on l until Close.
func (s *Server) ServeNBD(l net.Listener) error { return s.nbd.Serve(l) }

// Close stops every instance (replicas are closed cleanly, their data stays)
// and the NBD server.
func (s *Server) Close() error {
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
	if inst.eng == nil {
		return nil, fmt.Errorf("engine %s is not running: %w", name, engineapi.ErrBusy)
	}
	return inst, nil
}

// InstanceCreate starts a replica or an engine. Creating an instance that
// exists with the same spec returns it (managers retry); a different spec
// is an AlreadyExists error.
func (s *Server) InstanceCreate(_ context.Context, req *impb.InstanceCreateRequest) (*impb.Instance, error) {
	spec, err := specFromRequest(req)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	s.mu.Lock()
	if old, ok := s.instances[spec.Name]; ok {
		s.mu.Unlock()
		old.mu.Lock()
		defer old.mu.Unlock()
		if !old.spec.sameAs(spec) {
			return nil, engineapi.ToStatus(fmt.Errorf("instance %s exists with another spec: %w", spec.Name, engineapi.ErrAlreadyExists))
		}
		return s.toProto(old), nil
	}
	inst := &instance{spec: spec, state: impb.InstanceState_INSTANCE_STATE_STARTING}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	s.instances[spec.Name] = inst
	s.mu.Unlock()

	switch spec.Type {
	case impb.InstanceType_INSTANCE_TYPE_REPLICA:
		err = s.startReplica(inst)
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

// publishLocked sends an instance's new state to watchers; the caller holds inst.mu.
func (s *Server) publishLocked(inst *instance) {
	s.hub.publish(impb.WatchEvent_KIND_UPDATED, s.toProto(inst))
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
