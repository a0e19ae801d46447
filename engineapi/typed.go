package engineapi

import (
	"context"
	"maps"
	"time"

	"github.com/strata-storage/strata/engineapi/impb"
)

// typedClient is the DataPlane of one instance manager: the Client's calls
// with the wire types converted to Strata's at the boundary.
type typedClient struct{ c *Client }

// DataPlane returns the client as a DataPlane.
func (c *Client) DataPlane() DataPlane { return typedClient{c} }

// DataPlane returns the pooled client of an address as a DataPlane.
func (p *Pool) DataPlane(address string) (DataPlane, error) {
	c, err := p.Get(address)
	if err != nil {
		return nil, err
	}
	return c.DataPlane(), nil
}

var (
	_ Connector = (*Pool)(nil)
)

func (t typedClient) Address() string { return t.c.Address() }

func (t typedClient) InstanceCreate(ctx context.Context, spec InstanceSpec) (*Instance, error) {
	inst, err := t.c.InstanceCreate(ctx, &impb.InstanceCreateRequest{
		Name: spec.Name, Type: instanceTypeToWire(spec.Type), VolumeName: spec.VolumeName, Size: spec.Size,
		DataDir: spec.DataDir, BackingFile: spec.BackingFile, Replicas: spec.Replicas, Frontend: spec.Frontend,
		SnapshotMaxCount: spec.SnapshotMaxCount, SnapshotMaxSize: spec.SnapshotMaxSize,
	})
	if err != nil {
		return nil, err
	}
	return InstanceFromWire(inst), nil
}

func (t typedClient) InstanceDelete(ctx context.Context, name string) error {
	_, err := t.c.InstanceDelete(ctx, name)
	return err
}

func (t typedClient) Watch(ctx context.Context) (func() (*WatchEvent, error), error) {
	next, err := t.c.Watch(ctx)
	if err != nil {
		return nil, err
	}
	return func() (*WatchEvent, error) {
		ev, err := next()
		if err != nil {
			return nil, err
		}
		return WatchEventFromWire(ev), nil
	}, nil
}

func (t typedClient) EngineFreeze(ctx context.Context, engine, cut string, timeout, fsFreeze time.Duration) error {
	return t.c.EngineFreeze(ctx, engine, cut, timeout, fsFreeze)
}

func (t typedClient) EngineThaw(ctx context.Context, engine, cut string) error {
	return t.c.EngineThaw(ctx, engine, cut)
}

func (t typedClient) SnapshotCreateInCut(ctx context.Context, engine, cut, name string, userCreated bool, labels map[string]string) error {
	return t.c.SnapshotCreateInCut(ctx, engine, cut, name, userCreated, labels)
}

func (t typedClient) SnapshotCreate(ctx context.Context, engine, name string, userCreated bool, labels map[string]string, fsFreeze time.Duration) (string, error) {
	return t.c.SnapshotCreate(ctx, engine, name, userCreated, labels, fsFreeze)
}

func (t typedClient) SnapshotList(ctx context.Context, engine string) (map[string]*Snapshot, error) {
	snaps, err := t.c.SnapshotList(ctx, engine)
	if err != nil {
		return nil, err
	}
	return convertMap(snaps, snapshotFromWire), nil
}

func (t typedClient) SnapshotRemove(ctx context.Context, engine string, names ...string) error {
	return t.c.SnapshotRemove(ctx, engine, names...)
}

func (t typedClient) SnapshotPurge(ctx context.Context, engine string) error {
	return t.c.SnapshotPurge(ctx, engine)
}

func (t typedClient) SnapshotPurgeStatus(ctx context.Context, engine string) (map[string]*PurgeStatus, error) {
	st, err := t.c.SnapshotPurgeStatus(ctx, engine)
	if err != nil {
		return nil, err
	}
	return convertMap(st, purgeStatusFromWire), nil
}

func (t typedClient) SnapshotRevert(ctx context.Context, engine, name string) error {
	return t.c.SnapshotRevert(ctx, engine, name)
}

func (t typedClient) SnapshotExport(ctx context.Context, engine, snapshot string, fn func(ExportChunk) error) error {
	return t.c.SnapshotExport(ctx, engine, snapshot, func(c *impb.ExportChunk) error {
		return fn(ExportChunk{Offset: c.Offset, VolumeSize: c.VolumeSize, Data: c.Data})
	})
}

func (t typedClient) SnapshotBlocks(ctx context.Context, args SnapshotBlocksArgs,
	fn func(volumeSize int64, extents []BlockExtent) error) error {
	req := &impb.SnapshotBlocksRequest{Engine: args.Engine, Snapshot: args.Snapshot, BaseSnapshot: args.Base,
		StartingOffset: args.StartingOffset, MaxResults: args.MaxResults}
	return t.c.SnapshotBlocks(ctx, req, func(m *impb.SnapshotBlocksResponse) error {
		exts := make([]BlockExtent, 0, len(m.Extents))
		for _, e := range m.Extents {
			exts = append(exts, BlockExtent{Offset: e.Offset, Length: e.Length})
		}
		return fn(m.VolumeSize, exts)
	})
}

func (t typedClient) SnapshotClone(ctx context.Context, args SnapshotCloneArgs) error {
	return t.c.SnapshotClone(ctx, args)
}

func (t typedClient) SnapshotBackup(ctx context.Context, args SnapshotBackupArgs) error {
	return t.c.SnapshotBackup(ctx, args)
}

func (t typedClient) BackupRestore(ctx context.Context, args BackupRestoreArgs) error {
	return t.c.BackupRestore(ctx, args)
}

func (t typedClient) SnapshotLimitsSet(ctx context.Context, engine string, maxCount int32, maxSize int64) error {
	return t.c.SnapshotLimitsSet(ctx, engine, maxCount, maxSize)
}

func (t typedClient) VolumeExpand(ctx context.Context, engine string, size int64) error {
	return t.c.VolumeExpand(ctx, engine, size)
}

func (t typedClient) FrontendStart(ctx context.Context, engine, frontend string) error {
	_, err := t.c.FrontendStart(ctx, engine, frontend)
	return err
}

func (t typedClient) FrontendStop(ctx context.Context, engine string) error {
	_, err := t.c.FrontendStop(ctx, engine)
	return err
}

func (t typedClient) ReplicaAdd(ctx context.Context, engine, replica, address string, rebuild bool) error {
	return t.c.ReplicaAdd(ctx, engine, replica, address, rebuild)
}

func (t typedClient) ReplicaRemove(ctx context.Context, engine, replica string) error {
	return t.c.ReplicaRemove(ctx, engine, replica)
}

func (t typedClient) ReplicaRebuildStatus(ctx context.Context, engine string) (map[string]*RebuildStatus, error) {
	st, err := t.c.ReplicaRebuildStatus(ctx, engine)
	if err != nil {
		return nil, err
	}
	return convertMap(st, rebuildStatusFromWire), nil
}

func (t typedClient) ReplicaDataDelete(ctx context.Context, dataDir string) error {
	return t.c.ReplicaDataDelete(ctx, dataDir)
}

// InstanceFromWire converts the instance manager's report of an instance.
func InstanceFromWire(in *impb.Instance) *Instance {
	if in == nil {
		return nil
	}
	out := &Instance{
		Name: in.GetName(), Type: instanceTypeFromWire(in.GetType()), VolumeName: in.GetVolumeName(), Size: in.GetSize(),
		State: instanceStateFromWire(in.GetState()), Error: in.GetError(), Address: in.GetAddress(),
		FrontendEndpoint: in.GetFrontendEndpoint(), Revision: in.GetRevision(),
		Snapshots:     convertMap(in.GetSnapshots(), snapshotFromWire),
		PurgeStatus:   convertMap(in.GetPurgeStatus(), purgeStatusFromWire),
		RebuildStatus: convertMap(in.GetRebuildStatus(), rebuildStatusFromWire),
		CloneStatus:   cloneStatusFromWire(in.GetCloneStatus()),
		BackupStatus:  convertMap(in.GetBackupStatus(), backupStatusFromWire),
		RestoreStatus: restoreStatusFromWire(in.GetRestoreStatus()),
	}
	if modes := in.GetReplicaModes(); len(modes) > 0 {
		out.ReplicaModes = make(map[string]ReplicaMode, len(modes))
		for r, m := range modes {
			out.ReplicaModes[r] = replicaModeFromWire(m)
		}
	}
	return out
}

// WatchEventFromWire converts one event of the Watch stream.
func WatchEventFromWire(ev *impb.WatchEvent) *WatchEvent {
	out := &WatchEvent{Instance: InstanceFromWire(ev.GetInstance())}
	switch ev.GetKind() {
	case impb.WatchEvent_KIND_UPDATED:
		out.Kind = WatchUpdated
	case impb.WatchEvent_KIND_DELETED:
		out.Kind = WatchDeleted
	case impb.WatchEvent_KIND_SYNCED:
		out.Kind = WatchSynced
	default:
		out.Kind = WatchUnknown
	}
	return out
}

// convertMap converts every value of a wire map; an empty map becomes nil.
func convertMap[In, Out any](in map[string]In, conv func(In) Out) map[string]Out {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]Out, len(in))
	for k, v := range in {
		out[k] = conv(v)
	}
	return out
}

func snapshotFromWire(s *impb.Snapshot) *Snapshot {
	var labels map[string]string
	if len(s.GetLabels()) > 0 {
		labels = maps.Clone(s.GetLabels())
	}
	var children []string
	if len(s.GetChildren()) > 0 {
		children = append(children, s.GetChildren()...)
	}
	return &Snapshot{Name: s.GetName(), Parent: s.GetParent(), Children: children, Removed: s.GetRemoved(),
		UserCreated: s.GetUserCreated(), Created: s.GetCreated(), Size: s.GetSize(), Labels: labels,
		Exclusive: s.GetExclusive()}
}

func purgeStatusFromWire(p *impb.PurgeStatus) *PurgeStatus {
	return &PurgeStatus{IsPurging: p.GetIsPurging(), Progress: p.GetProgress(), State: p.GetState(), Error: p.GetError()}
}

func cloneStatusFromWire(c *impb.CloneStatus) *CloneStatus {
	if c == nil {
		return nil
	}
	return &CloneStatus{Snapshot: c.GetSnapshot(), SourceAddress: c.GetSourceAddress(), Progress: c.GetProgress()}
}

func backupStatusFromWire(b *impb.BackupStatus) *BackupStatus {
	return &BackupStatus{Snapshot: b.GetSnapshot(), State: b.GetState(), Progress: b.GetProgress(),
		BytesDone: b.GetBytesDone(), BytesTotal: b.GetBytesTotal(), Error: b.GetError(),
		BaseBackup: b.GetBaseBackup(), Message: b.GetMessage(), Replica: b.GetReplica(),
		VolumeSize: b.GetVolumeSize(), ChunkSize: b.GetChunkSize(), DataChunks: b.GetDataChunks(),
		BackingChunks: b.GetBackingChunks(), ReadChunks: b.GetReadChunks(), NewChunks: b.GetNewChunks(),
		NewBytes: b.GetNewBytes(), StoredBytes: b.GetStoredBytes()}
}

func restoreStatusFromWire(r *impb.RestoreStatus) *RestoreStatus {
	if r == nil {
		return nil
	}
	return &RestoreStatus{Backup: r.GetBackup(), Volume: r.GetVolume(), State: r.GetState(), Progress: r.GetProgress(),
		BytesDone: r.GetBytesDone(), BytesTotal: r.GetBytesTotal(), Error: r.GetError()}
}

// BackupTargetToWire converts a backup target for a request.
func BackupTargetToWire(t BackupTarget) *impb.BackupTarget {
	return &impb.BackupTarget{Url: t.URL, S3Endpoint: t.S3Endpoint, AccessKey: t.AccessKey, SecretKey: t.SecretKey}
}

func rebuildStatusFromWire(r *impb.RebuildStatus) *RebuildStatus {
	return &RebuildStatus{IsRebuilding: r.GetIsRebuilding(), Progress: r.GetProgress(), State: r.GetState(),
		Error: r.GetError(), FromReplica: r.GetFromReplica(), CopiedBytes: r.GetCopiedBytes(),
		KeptBytes: r.GetKeptBytes(), CopiedLayers: r.GetCopiedLayers(), KeptLayers: r.GetKeptLayers()}
}

func instanceTypeFromWire(t impb.InstanceType) InstanceType {
	if t == impb.InstanceType_INSTANCE_TYPE_ENGINE {
		return InstanceTypeEngine
	}
	if t == impb.InstanceType_INSTANCE_TYPE_REPLICA {
		return InstanceTypeReplica
	}
	return ""
}

func instanceTypeToWire(t InstanceType) impb.InstanceType {
	switch t {
	case InstanceTypeEngine:
		return impb.InstanceType_INSTANCE_TYPE_ENGINE
	case InstanceTypeReplica:
		return impb.InstanceType_INSTANCE_TYPE_REPLICA
	}
	return impb.InstanceType_INSTANCE_TYPE_UNSPECIFIED
}

func instanceStateFromWire(s impb.InstanceState) InstanceState {
	switch s {
	case impb.InstanceState_INSTANCE_STATE_STARTING:
		return InstanceStateStarting
	case impb.InstanceState_INSTANCE_STATE_RUNNING:
		return InstanceStateRunning
	case impb.InstanceState_INSTANCE_STATE_STOPPING:
		return InstanceStateStopping
	case impb.InstanceState_INSTANCE_STATE_STOPPED:
		return InstanceStateStopped
	case impb.InstanceState_INSTANCE_STATE_ERROR:
		return InstanceStateError
	}
	return InstanceStateUnknown
}

func replicaModeFromWire(m impb.ReplicaMode) ReplicaMode {
	switch m {
	case impb.ReplicaMode_REPLICA_MODE_RW:
		return ReplicaModeRW
	case impb.ReplicaMode_REPLICA_MODE_WO:
		return ReplicaModeWO
	}
	return ReplicaModeERR
}
