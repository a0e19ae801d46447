package engineapi

import (
	"context"
	"time"
)

// DataPlane is one instance manager as the controllers see it: Strata's own
// types in and out, typed errors (ErrNotFound, ErrAlreadyExists,
// ErrLimitExceeded, ErrBusy, ErrInvalid, ErrUnavailable), no wire types.
// The gRPC client implements it (Client.DataPlane); unit tests use a small
// in-memory implementation.
type DataPlane interface {
	// Address is the instance manager's gRPC address.
	Address() string

	// InstanceCreate starts an engine or replica; the same spec again returns
	// the running instance, another spec under the same name ErrAlreadyExists.
	InstanceCreate(ctx context.Context, spec InstanceSpec) (*Instance, error)
	// InstanceDelete stops an instance (ErrNotFound when there is none).
	InstanceDelete(ctx context.Context, name string) error
	// Watch streams every instance's state, then a Synced event, then changes.
	Watch(ctx context.Context) (func() (*WatchEvent, error), error)

	// SnapshotCreate takes a snapshot on every replica of an engine at one
	// point in the write stream and returns its name. fsFreeze above 0:
	// inside a freeze of the volume's filesystem of at most that long, if
	// the node's CSI plugin has it staged with one.
	SnapshotCreate(ctx context.Context, engine, name string, userCreated bool, labels map[string]string, fsFreeze time.Duration) (string, error)
	// EngineFreeze freezes an engine for a group cut (writes wait until
	// EngineThaw of the cut or the timeout); SnapshotCreateInCut takes a
	// snapshot inside that freeze (ErrFreezeLost once it ended). See GroupCut.
	EngineFreeze(ctx context.Context, engine, cut string, timeout, fsFreeze time.Duration) error
	EngineThaw(ctx context.Context, engine, cut string) error
	SnapshotCreateInCut(ctx context.Context, engine, cut, name string, userCreated bool, labels map[string]string) error
	// SnapshotList returns an engine's chain by snapshot name.
	SnapshotList(ctx context.Context, engine string) (map[string]*Snapshot, error)
	// SnapshotRemove marks snapshots removed; their data goes at the next purge.
	SnapshotRemove(ctx context.Context, engine string, names ...string) error
	// SnapshotPurge starts a purge of removed snapshots (ErrBusy while one runs).
	SnapshotPurge(ctx context.Context, engine string) error
	// SnapshotPurgeStatus reports each replica's purge.
	SnapshotPurgeStatus(ctx context.Context, engine string) (map[string]*PurgeStatus, error)
	// SnapshotRevert puts a new head on a snapshot of a detached engine.
	SnapshotRevert(ctx context.Context, engine, name string) error
	// SnapshotClone fills an engine's volume from a snapshot of another
	// volume, read from one of its replicas.
	SnapshotClone(ctx context.Context, args SnapshotCloneArgs) error
	// SnapshotExport streams a snapshot's bytes to fn, chunk by chunk (see
	// Client.SnapshotExport for how chunks make the image).
	SnapshotExport(ctx context.Context, engine, snapshot string, fn func(ExportChunk) error) error
	// SnapshotBlocks hands fn the volume's size and, batch by batch, the
	// extents where a snapshot holds data, or with a base those written
	// since that older snapshot of its chain (see Client.SnapshotBlocks).
	SnapshotBlocks(ctx context.Context, args SnapshotBlocksArgs, fn func(volumeSize int64, extents []BlockExtent) error) error
	// SnapshotBackup starts a backup of a snapshot of an engine's volume to
	// a backup target; Instance.BackupStatus follows it (ErrBusy while
	// another backup or restore of the engine runs; the same backup again is
	// a no-op).
	SnapshotBackup(ctx context.Context, args SnapshotBackupArgs) error
	// BackupRestore starts filling a new engine's volume with a backup;
	// Instance.RestoreStatus follows it.
	BackupRestore(ctx context.Context, args BackupRestoreArgs) error
	// SnapshotLimitsSet sets an engine's limits on user snapshots.
	SnapshotLimitsSet(ctx context.Context, engine string, maxCount int32, maxSize int64) error

	// VolumeExpand grows an engine's volume.
	VolumeExpand(ctx context.Context, engine string, size int64) error
	// FrontendStart exposes an engine over NBD; FrontendStop withdraws it.
	FrontendStart(ctx context.Context, engine, frontend string) error
	FrontendStop(ctx context.Context, engine string) error

	// ReplicaAdd adds a replica to an engine, rebuilding it from the others
	// when rebuild is set; ReplicaRemove takes one out.
	ReplicaAdd(ctx context.Context, engine, replica, address string, rebuild bool) error
	ReplicaRemove(ctx context.Context, engine, replica string) error
	// ReplicaRebuildStatus reports the rebuilds an engine runs.
	ReplicaRebuildStatus(ctx context.Context, engine string) (map[string]*RebuildStatus, error)
	// ReplicaDataDelete deletes a replica's data directory; refused while an
	// instance uses it.
	ReplicaDataDelete(ctx context.Context, dataDir string) error
}

// ExportChunk is a piece of an exported snapshot: Data at Offset. The first
// chunk also carries the volume's size.
type ExportChunk struct {
	Offset, VolumeSize int64
	Data               []byte
}

// SnapshotBlocksArgs ask for a snapshot's blocks (Base empty) or for those
// written since Base; extents ending at or before StartingOffset are left
// out; MaxResults bounds each batch (0: the instance manager's choice).
type SnapshotBlocksArgs struct {
	Engine, Snapshot, Base string
	StartingOffset         int64
	MaxResults             int32
}

// BlockExtent is a range of a volume, in bytes.
type BlockExtent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// SnapshotCloneArgs are the arguments of a snapshot clone.
type SnapshotCloneArgs struct {
	// Engine is the target: a new volume's engine, frontend stopped.
	Engine string
	// SourceAddress is the dataconn address of a replica of the source
	// volume, Snapshot the snapshot of it to copy.
	SourceAddress string
	Snapshot      string
	// BackingShared says the target's replicas sit on the same backing
	// image as the source's (each on its own copy), so what only the image
	// holds is not copied. False (the default) copies it: the target then
	// reads as the snapshot with no backing file of its own.
	BackingShared bool
}

// BackupTarget is where backups go: URL file:///<dir> or
// s3://<bucket>@<region>/<prefix>; the S3 endpoint and keys for s3://.
type BackupTarget struct {
	URL                  string
	S3Endpoint           string
	AccessKey, SecretKey string
}

// BackingImageRef names the backing image a volume's replicas sit on, as
// recorded in a backup's manifest.
type BackingImageRef struct {
	Name, URL, Checksum string
}

// SnapshotBackupArgs are the arguments of a snapshot backup.
type SnapshotBackupArgs struct {
	Engine, Snapshot string
	// Backup is the backup's name, Volume the volume it is filed under on
	// the target.
	Backup, Volume string
	Target         BackupTarget
	// BaseBackup is the previous backup of Volume on the target and
	// BaseSnapshot its snapshot: only the layers after BaseSnapshot are
	// read. Empty, or a BaseSnapshot gone from the chain: a full backup.
	BaseBackup, BaseSnapshot string
	Labels                   map[string]string
	// BackingImage is required when the replicas sit on a backing image:
	// its bytes are recorded in the manifest, never uploaded.
	BackingImage *BackingImageRef
	Concurrency  int32
}

// BackupRestoreArgs are the arguments of a restore.
type BackupRestoreArgs struct {
	// Engine is the target: a new volume's engine, frontend stopped.
	Engine         string
	Backup, Volume string
	Target         BackupTarget
	// Backing says the engine's replicas already have the backup's backing
	// image as their backing file, so its chunks are left to it.
	Backing     bool
	Concurrency int32
}

// Connector hands out the DataPlane of an instance manager by address.
// Pool implements it.
type Connector interface {
	DataPlane(address string) (DataPlane, error)
}

// InstanceType tells an engine from a replica.
type InstanceType string

const (
	InstanceTypeEngine  InstanceType = "engine"
	InstanceTypeReplica InstanceType = "replica"
)

// InstanceState is an instance's lifecycle state. The values are those of
// the API's InstanceState, so controllers copy them as they are.
type InstanceState string

const (
	InstanceStateStarting InstanceState = "starting"
	InstanceStateRunning  InstanceState = "running"
	InstanceStateStopping InstanceState = "stopping"
	InstanceStateStopped  InstanceState = "stopped"
	InstanceStateError    InstanceState = "error"
	InstanceStateUnknown  InstanceState = "unknown"
)

// ReplicaMode is a replica's mode in an engine, as the API spells it.
type ReplicaMode string

const (
	ReplicaModeRW  ReplicaMode = "RW"
	ReplicaModeWO  ReplicaMode = "WO"
	ReplicaModeERR ReplicaMode = "ERR"
)

// InstanceSpec is what InstanceCreate starts.
type InstanceSpec struct {
	Name       string
	Type       InstanceType
	VolumeName string
	Size       int64
	// DataDir (replica) is the directory of the replica's layers;
	// BackingFile (replica) the read-only bottom layer, if any.
	DataDir     string
	BackingFile string
	// Replicas (engine) maps replica names to their data addresses.
	Replicas map[string]string
	// Frontend (engine) is "nbd" or "" for none.
	Frontend         string
	SnapshotMaxCount int32
	SnapshotMaxSize  int64
}

// GrowableExportSuffix names an engine's second NBD export, which follows
// an online expansion: it advertises MaxVolumeSize and serves the volume's
// current size (nbd.Growable). The CSI node plugin connects to it.
const GrowableExportSuffix = "+growable"

// MaxVolumeSize is the largest volume the data plane serves (2^32 blocks).
const MaxVolumeSize = 16 << 40

// Instance is what the instance manager reports of one instance.
type Instance struct {
	Name       string
	Type       InstanceType
	VolumeName string
	Size       int64
	State      InstanceState
	Error      string
	// Address is where a replica serves the data connection.
	Address string
	// FrontendEndpoint is where an engine's frontend serves clients.
	FrontendEndpoint string
	ReplicaModes     map[string]ReplicaMode
	Snapshots        map[string]*Snapshot
	PurgeStatus      map[string]*PurgeStatus
	RebuildStatus    map[string]*RebuildStatus
	// CloneStatus is the snapshot clone filling an engine, while one runs.
	CloneStatus *CloneStatus
	// BackupStatus is an engine's last snapshot backup by backup name,
	// kept after it ends until the next one starts (or for an hour).
	BackupStatus map[string]*BackupStatus
	// RestoreStatus is the restore filling an engine, kept after it ends.
	RestoreStatus *RestoreStatus
	// Revision grows with every change within one instance manager's life.
	Revision uint64
}

// Snapshot is one entry of an engine's chain.
type Snapshot struct {
	Name        string
	Parent      string
	Children    []string
	Removed     bool
	UserCreated bool
	Created     string
	Size        int64
	Labels      map[string]string
	// Exclusive is what deleting the snapshot would free now, in bytes.
	Exclusive int64
}

// PurgeStatus is one replica's purge.
type PurgeStatus struct {
	IsPurging bool
	Progress  int32
	State     string
	Error     string
}

// RebuildStatus is one replica's rebuild.
type RebuildStatus struct {
	IsRebuilding bool
	Progress     int32
	State        string
	Error        string
	FromReplica  string
	// CopiedBytes is the layer data sent so far; KeptLayers layers (of
	// KeptBytes on the source) were already on a returning replica and are
	// kept, CopiedLayers are copied.
	CopiedBytes, KeptBytes   int64
	CopiedLayers, KeptLayers int32
}

// CloneStatus is a running snapshot clone.
type CloneStatus struct {
	Snapshot      string
	SourceAddress string
	Progress      int32
}

// Backup and restore job states.
const (
	JobStateInProgress = "in-progress"
	JobStateCompleted  = "completed"
	JobStateError      = "error"
)

// BackupStatus is one snapshot backup of an engine.
type BackupStatus struct {
	Snapshot string
	State    string // JobStateInProgress, JobStateCompleted or JobStateError
	Progress int32  // percent of the bytes to read
	// BytesDone of BytesTotal to read from the snapshot.
	BytesDone, BytesTotal int64
	Error                 string
	// BaseBackup is the base actually used ("" for a full backup); Message
	// says why a base asked for was not.
	BaseBackup, Message string
	Replica             string // the replica read
	// Set when completed, from the manifest: the volume's size, chunk size,
	// chunks with data, chunks left to the backing image, chunks read,
	// chunks and stored bytes this backup uploaded, stored bytes of every
	// chunk it references.
	VolumeSize, ChunkSize                 int64
	DataChunks, BackingChunks, ReadChunks int64
	NewChunks, NewBytes, StoredBytes      int64
}

// RestoreStatus is a restore into an engine.
type RestoreStatus struct {
	Backup, Volume string
	State          string // JobStateInProgress, JobStateCompleted or JobStateError
	Progress       int32
	// BytesDone of BytesTotal stored (compressed) bytes fetched.
	BytesDone, BytesTotal int64
	Error                 string
}

// WatchEventKind says what a WatchEvent carries.
type WatchEventKind int

const (
	// WatchUpdated carries an instance's current state.
	WatchUpdated WatchEventKind = iota
	// WatchDeleted carries the name of an instance that is gone.
	WatchDeleted
	// WatchSynced ends the replay of the current state.
	WatchSynced
	// WatchUnknown is a kind this client does not know (a newer instance
	// manager); readers skip it.
	WatchUnknown
)

// WatchEvent is one event of the Watch stream.
type WatchEvent struct {
	Kind     WatchEventKind
	Instance *Instance
}
