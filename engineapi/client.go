package engineapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/pki"
)

// DefaultTimeout bounds every unary call; streams are bounded by their context.
const DefaultTimeout = 30 * time.Second

// Client talks to one instance manager over one gRPC connection.
//
// Errors: every call can fail with ErrUnavailable (the instance manager
// cannot be reached) and, past its timeout or ctx, with
// context.DeadlineExceeded or context.Canceled. "The engine errors" below
// are those of calls on an engine: ErrNotFound (no such instance),
// ErrInvalid (the instance is not an engine) and ErrBusy (the engine is not
// running). Failures not listed carry no class: errors.Is matches none of
// the Err values.
type Client struct {
	address string
	conn    *grpc.ClientConn
	im      impb.InstanceManagerClient
	timeout time.Duration
}

// NewClient connects lazily: the first call dials, and gRPC reconnects
// after a failure by itself. tlsConfig authenticates both ends (a manager's
// certificate, an instance manager's expected: pki.ClientConfig); nil
// speaks plain gRPC, which only in-process tests' servers accept.
//
// extra dial options come last (tests: a dialer from another address).
func NewClient(address string, timeout time.Duration, tlsConfig *tls.Config, extra ...grpc.DialOption) (*Client, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	creds := insecure.NewCredentials()
	if tlsConfig != nil {
		// The instance manager must also show a certificate issued for
		// this address: another node's is refused.
		creds = credentials.NewTLS(pki.ForAddress(tlsConfig, address))
	}
	conn, err := grpc.NewClient(address, append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Notice a dead instance manager within seconds, even on an idle
		// connection that only carries a Watch.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second,
			PermitWithoutStream: true}),
		grpc.WithUnaryInterceptor(countUnary), grpc.WithStreamInterceptor(countStream)}, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("instance manager %s: %w", address, err)
	}
	return &Client{address: address, conn: conn, im: impb.NewInstanceManagerClient(conn), timeout: timeout}, nil
}

// Address is the instance manager's gRPC address; it makes no call and cannot fail.
func (c *Client) Address() string { return c.address }

// Close closes the connection; its error, if any, is gRPC's (no typed error).
func (c *Client) Close() error { return c.conn.Close() }

// call runs one unary call with the client's timeout and typed errors.
func call[Req, Resp any](ctx context.Context, c *Client, fn func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := fn(ctx, req)
	return resp, FromStatus(err)
}

// InstanceCreate starts a replica or engine instance, or returns the existing one if its spec is the same (so it
// can be retried); ErrAlreadyExists if it exists with another spec, ErrInvalid for a bad spec, no replicas or a
// replica larger than the size asked for, ErrBusy if the data dir is in use or being deleted or the volume is
// already exported here by another engine.
func (c *Client) InstanceCreate(ctx context.Context, req *impb.InstanceCreateRequest) (*impb.Instance, error) {
	return call(ctx, c, c.im.InstanceCreate, req)
}

// InstanceDelete stops an instance (a replica's data stays on disk) and returns its final state; ErrNotFound if
// there is no such instance.
func (c *Client) InstanceDelete(ctx context.Context, name string) (*impb.Instance, error) {
	return call(ctx, c, c.im.InstanceDelete, &impb.InstanceRef{Name: name})
}

// InstanceGet returns one instance; ErrNotFound if there is no such instance.
func (c *Client) InstanceGet(ctx context.Context, name string) (*impb.Instance, error) {
	return call(ctx, c, c.im.InstanceGet, &impb.InstanceRef{Name: name})
}

// InstanceList returns every instance, sorted by name; only ErrUnavailable.
func (c *Client) InstanceList(ctx context.Context) ([]*impb.Instance, error) {
	resp, err := call(ctx, c, c.im.InstanceList, &impb.InstanceListRequest{})
	if err != nil {
		return nil, err
	}
	return resp.Instances, nil
}

// Watch streams instance changes until ctx ends or the connection breaks;
// the first events are the current state of every instance. Both Watch and
// the function it returns fail only with ErrUnavailable or ctx's error.
func (c *Client) Watch(ctx context.Context) (func() (*impb.WatchEvent, error), error) {
	stream, err := c.im.Watch(ctx, &impb.WatchRequest{})
	if err != nil {
		return nil, FromStatus(err)
	}
	return func() (*impb.WatchEvent, error) {
		ev, err := stream.Recv()
		return ev, FromStatus(err)
	}, nil
}

// SnapshotCreate takes a snapshot on every replica and returns its name (generated if name is empty);
// ErrAlreadyExists if the name is taken, ErrInvalid if the replicas refuse the name, ErrLimitExceeded past the
// snapshot limits, ErrBusy while a clone or a rebuild runs, and the engine errors.
func (c *Client) SnapshotCreate(ctx context.Context, engine, name string, userCreated bool, labels map[string]string, fsFreeze time.Duration) (string, error) {
	resp, err := call(ctx, c, c.im.SnapshotCreate, &impb.SnapshotCreateRequest{Engine: engine, Name: name,
		UserCreated: userCreated, Labels: labels, FsFreezeTimeoutMs: fsFreeze.Milliseconds()})
	if err != nil {
		return "", err
	}
	return resp.Name, nil
}

// EngineFreeze freezes the engine for a group cut: writes wait, those in flight drain, until EngineThaw of
// the cut or the timeout (at most a minute); ErrBusy while frozen for another cut or a rebuild runs, ErrInvalid
// for a missing cut or a timeout out of range, and the engine errors.
func (c *Client) EngineFreeze(ctx context.Context, engine, cut string, timeout, fsFreeze time.Duration) error {
	_, err := call(ctx, c, c.im.EngineFreeze, &impb.EngineFreezeRequest{Engine: engine, Cut: cut, TimeoutMs: timeout.Milliseconds(),
		FsFreezeTimeoutMs: fsFreeze.Milliseconds()})
	return err
}

// EngineThaw ends the engine's freeze for the cut; a cut no longer frozen is success.
func (c *Client) EngineThaw(ctx context.Context, engine, cut string) error {
	_, err := call(ctx, c, c.im.EngineThaw, &impb.EngineThawRequest{Engine: engine, Cut: cut})
	return err
}

// SnapshotCreateInCut is SnapshotCreate inside the engine's freeze for cut; ErrFreezeLost (nothing taken) once
// that freeze has ended.
func (c *Client) SnapshotCreateInCut(ctx context.Context, engine, cut, name string, userCreated bool, labels map[string]string) error {
	_, err := call(ctx, c, c.im.SnapshotCreate, &impb.SnapshotCreateRequest{Engine: engine, Name: name,
		UserCreated: userCreated, Labels: labels, Cut: cut})
	return err
}

// SnapshotList returns the engine's snapshot chain keyed by name, the live head (types.VolumeHeadName)
// included; the engine errors.
func (c *Client) SnapshotList(ctx context.Context, engine string) (map[string]*impb.Snapshot, error) {
	resp, err := call(ctx, c, c.im.SnapshotList, &impb.InstanceRef{Name: engine})
	if err != nil {
		return nil, err
	}
	return resp.Snapshots, nil
}

// SnapshotRemove marks the snapshots removed, in order, stopping at the first failure (SnapshotPurge frees their
// data); ErrNotFound for a missing snapshot or the head, ErrBusy while a rebuild runs, and the engine errors.
func (c *Client) SnapshotRemove(ctx context.Context, engine string, names ...string) error {
	_, err := call(ctx, c, c.im.SnapshotRemove, &impb.SnapshotRemoveRequest{Engine: engine, Names: names})
	return err
}

// SnapshotPurge starts a purge of the removed snapshots on every replica and returns (SnapshotPurgeStatus
// follows it); ErrBusy while a rebuild runs, and the engine errors.
func (c *Client) SnapshotPurge(ctx context.Context, engine string) error {
	_, err := call(ctx, c, c.im.SnapshotPurge, &impb.InstanceRef{Name: engine})
	return err
}

// SnapshotPurgeStatus returns each replica's purge progress, keyed by replica name; the engine errors.
func (c *Client) SnapshotPurgeStatus(ctx context.Context, engine string) (map[string]*impb.PurgeStatus, error) {
	resp, err := call(ctx, c, c.im.SnapshotPurgeStatus, &impb.InstanceRef{Name: engine})
	if err != nil {
		return nil, err
	}
	return resp.Status, nil
}

// SnapshotRevert puts a new empty head on the snapshot on every replica; ErrNotFound for a missing snapshot,
// ErrInvalid for one marked removed, ErrBusy while the frontend is up or a clone or rebuild runs, and the engine
// errors.
func (c *Client) SnapshotRevert(ctx context.Context, engine, name string) error {
	_, err := call(ctx, c, c.im.SnapshotRevert, &impb.SnapshotRevertRequest{Engine: engine, Name: name})
	return err
}

// SnapshotClone fills a.Engine's new, empty volume (frontend stopped,
// no snapshots) with a.Snapshot of another volume, read from that volume's
// replica serving dataconn at a.SourceAddress. It returns when the copy is
// done and flushed, which takes as long as the data needs: it is bounded by
// ctx only, not by the client's unary timeout, so give ctx a deadline that
// fits the volume. Cancelling ctx stops the clone and leaves the target
// partly filled; calling again starts over. Errors: ErrInvalid for an
// empty argument, a target with snapshots or smaller than the source, the
// head or a removed snapshot, BackingShared without a backing file of the
// same size on both sides; ErrNotFound for a missing snapshot; ErrBusy
// while the target's frontend is up, another clone into it runs or a purge
// runs on the source replica; and the engine errors. An unreachable source
// is untyped.
func (c *Client) SnapshotClone(ctx context.Context, a SnapshotCloneArgs) error {
	_, err := c.im.SnapshotClone(ctx, &impb.SnapshotCloneRequest{Engine: a.Engine, SourceAddress: a.SourceAddress,
		Snapshot: a.Snapshot, BackingShared: a.BackingShared})
	return FromStatus(err)
}

// SnapshotBackup starts a backup of a.Snapshot of a.Engine's volume to
// a.Target as backup a.Backup of volume a.Volume, and returns once it
// runs: follow it in the engine's BackupStatus (Watch). The same backup
// again while it runs or after it completed is a no-op; after it failed it
// starts over. Errors: ErrInvalid for an empty or bad argument (names,
// target URL, a volume on a backing file without BackingImage); ErrBusy
// while another backup or a restore of the engine runs; and the engine
// errors. What the backup meets later (a missing snapshot, an unreachable
// target) is in its BackupStatus.
func (c *Client) SnapshotBackup(ctx context.Context, a SnapshotBackupArgs) error {
	req := &impb.SnapshotBackupRequest{Engine: a.Engine, Snapshot: a.Snapshot, Backup: a.Backup, Volume: a.Volume,
		Target: BackupTargetToWire(a.Target), BaseBackup: a.BaseBackup, BaseSnapshot: a.BaseSnapshot,
		Labels: a.Labels, Concurrency: a.Concurrency}
	if b := a.BackingImage; b != nil {
		req.BackingImage = &impb.BackingImageRef{Name: b.Name, Url: b.URL, Checksum: b.Checksum}
	}
	_, err := call(ctx, c, c.im.SnapshotBackup, req)
	return err
}

// BackupRestore starts filling a.Engine's new volume (frontend stopped, no
// snapshots) with backup a.Backup of volume a.Volume on a.Target, and
// returns once it runs: follow it in the engine's RestoreStatus (Watch).
// The same restore again while it runs or after it completed is a no-op;
// after it failed it starts over. Errors: ErrInvalid for an empty or bad
// argument; ErrBusy while the frontend is up or another restore, backup or
// clone of the engine runs; and the engine errors. A missing backup, a
// damaged chunk (named) or a target too small is in its RestoreStatus.
func (c *Client) BackupRestore(ctx context.Context, a BackupRestoreArgs) error {
	_, err := call(ctx, c, c.im.BackupRestore, &impb.BackupRestoreRequest{Engine: a.Engine, Backup: a.Backup,
		Volume: a.Volume, Target: BackupTargetToWire(a.Target), Backing: a.Backing, Concurrency: a.Concurrency})
	return err
}

// SnapshotExport streams a snapshot's data and calls fn for every chunk,
// in order; an error from fn stops the stream and is returned. The first
// chunk carries the volume size. To rebuild the snapshot, start from a
// zeroed image of that size and write each chunk's data at its offset in
// the order received: a later chunk overrides an earlier one at the same
// offsets, and bytes no chunk covers are zero. Each chunk holds at most
// 1 MiB. If SnapshotExport returns an error the image is incomplete. Like
// Watch, it is bounded by ctx, not by the client's unary timeout. Errors:
// ErrInvalid for an empty name, the head or a removed snapshot; ErrNotFound
// for a missing snapshot; ErrBusy while a clone into the engine or a purge
// on the replica read runs; the engine errors; and whatever fn returns.
func (c *Client) SnapshotExport(ctx context.Context, engine, snapshot string, fn func(*impb.ExportChunk) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.im.SnapshotExport(ctx, &impb.SnapshotExportRequest{Engine: engine, Snapshot: snapshot})
	if err != nil {
		return FromStatus(err)
	}
	return receiveAll(stream.Recv, fn)
}

// receiveAll hands every message of a server stream to fn until the
// stream ends (nil), fails (its status as an engineapi error) or fn fails.
func receiveAll[T any](recv func() (T, error), fn func(T) error) error {
	for {
		msg, err := recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return FromStatus(err)
		}
		if err := fn(msg); err != nil {
			return err
		}
	}
}

// SnapshotBlocks calls fn with the volume's size and each batch of
// extents where snapshot holds data, or with base those written after that
// older snapshot of its chain (see the RPC); ErrInvalid for a base that is
// not an ancestor, ErrNotFound for an unknown snapshot, ErrBusy while a
// purge runs.
func (c *Client) SnapshotBlocks(ctx context.Context, req *impb.SnapshotBlocksRequest,
	fn func(*impb.SnapshotBlocksResponse) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.im.SnapshotBlocks(ctx, req)
	if err != nil {
		return FromStatus(err)
	}
	return receiveAll(stream.Recv, fn)
}

// SnapshotLimitsSet sets the limits on user snapshots (count, bytes; 0 is no limit) on every replica; ErrInvalid
// for a negative limit, and the engine errors.
func (c *Client) SnapshotLimitsSet(ctx context.Context, engine string, maxCount int32, maxSize int64) error {
	_, err := call(ctx, c, c.im.SnapshotLimitsSet, &impb.SnapshotLimitsRequest{Engine: engine, MaxCount: maxCount, MaxSize: maxSize})
	return err
}

// VolumeExpand grows the volume to size bytes on every replica; ErrInvalid if size is not a multiple of 4096,
// ErrBusy while the frontend is up or a rebuild runs, and the engine errors (a size not larger is untyped).
func (c *Client) VolumeExpand(ctx context.Context, engine string, size int64) error {
	_, err := call(ctx, c, c.im.VolumeExpand, &impb.VolumeExpandRequest{Engine: engine, Size: size})
	return err
}

// FrontendStart serves the engine over NBD (a no-op if it already does) and returns the instance; ErrInvalid if
// frontend is not "nbd", ErrBusy while a clone runs or another engine exports the volume here, and the engine errors.
func (c *Client) FrontendStart(ctx context.Context, engine, frontend string) (*impb.Instance, error) {
	return call(ctx, c, c.im.FrontendStart, &impb.FrontendStartRequest{Engine: engine, Frontend: frontend})
}

// FrontendStop stops serving the engine, closing its clients, and returns the instance; the engine errors.
func (c *Client) FrontendStop(ctx context.Context, engine string) (*impb.Instance, error) {
	return call(ctx, c, c.im.FrontendStop, &impb.InstanceRef{Name: engine})
}

// ReplicaAdd attaches a replica: one holding the volume's data at once (RW), or with rebuild a new empty one that
// is filled in the background; with rebuild, ErrInvalid for a missing name or address or a non-empty replica,
// ErrAlreadyExists if it is attached, ErrBusy while a rebuild or purge runs; the engine errors either way.
func (c *Client) ReplicaAdd(ctx context.Context, engine, replica, address string, rebuild bool) error {
	_, err := call(ctx, c, c.im.ReplicaAdd, &impb.ReplicaAddRequest{Engine: engine, Replica: replica, Address: address, Rebuild: rebuild})
	return err
}

// ReplicaRemove detaches a replica from the engine; ErrNotFound if it has no such replica, and the engine errors.
func (c *Client) ReplicaRemove(ctx context.Context, engine, replica string) error {
	_, err := call(ctx, c, c.im.ReplicaRemove, &impb.ReplicaRemoveRequest{Engine: engine, Replica: replica})
	return err
}

// ReplicaRebuildStatus returns the engine's rebuilds keyed by replica name; the engine errors.
func (c *Client) ReplicaRebuildStatus(ctx context.Context, engine string) (map[string]*impb.RebuildStatus, error) {
	resp, err := call(ctx, c, c.im.ReplicaRebuildStatus, &impb.InstanceRef{Name: engine})
	if err != nil {
		return nil, err
	}
	return resp.Status, nil
}

// ReplicaDataDelete removes a replica's data directory on the instance
// manager's node. A directory that is already gone is success, so it can be
// retried. It fails with ErrBusy while a replica instance of that instance
// manager uses the directory (delete the instance first), and with
// ErrInvalid for a path that is not absolute or a non-empty directory
// holding no volume.meta.
func (c *Client) ReplicaDataDelete(ctx context.Context, dataDir string) error {
	_, err := call(ctx, c, c.im.ReplicaDataDelete, &impb.ReplicaDataDeleteRequest{DataDir: dataDir})
	return err
}

// Pool keeps one client per instance-manager address, shared by every
// controller of a manager.
type Pool struct {
	mu      sync.Mutex
	timeout time.Duration
	tls     *tls.Config
	clients map[string]*Client
}

// NewPool returns an empty pool whose clients use timeout for unary calls
// and tlsConfig (see NewClient).
func NewPool(timeout time.Duration, tlsConfig *tls.Config) *Pool {
	return &Pool{timeout: timeout, tls: tlsConfig, clients: map[string]*Client{}}
}

// Get returns the pooled client for an address, creating it on first use;
// it fails (untyped) only for an address gRPC cannot parse, as it dials lazily.
func (p *Pool) Get(address string) (*Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[address]; ok {
		return c, nil
	}
	c, err := NewClient(address, p.timeout, p.tls)
	if err != nil {
		return nil, err
	}
	p.clients[address] = c
	return c, nil
}

// Forget closes and drops the client of an address that went away; it cannot fail.
func (p *Pool) Forget(address string) {
	p.mu.Lock()
	c, ok := p.clients[address]
	delete(p.clients, address)
	p.mu.Unlock()
	if ok {
		_ = c.Close()
	}
}

// Close closes every client and empties the pool; it cannot fail.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.clients {
		_ = c.Close()
		delete(p.clients, addr)
	}
}

// Metrics returns the instance manager's Prometheus series.
func (c *Client) Metrics(ctx context.Context) ([]*dto.MetricFamily, error) {
	resp, err := call(ctx, c, c.im.Metrics, &impb.Empty{})
	if err != nil {
		return nil, err
	}
	dec := expfmt.NewDecoder(bytes.NewReader(resp.Families), expfmt.NewFormat(expfmt.TypeProtoDelim))
	var out []*dto.MetricFamily
	for {
		f := &dto.MetricFamily{}
		if err := dec.Decode(f); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("decoding the instance manager's metrics: %w", err)
		}
		out = append(out, f)
	}
}
