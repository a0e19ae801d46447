package engineapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/strata-storage/strata/engineapi/impb"
)

// DefaultTimeout bounds every unary call; streams are bounded by their context.
const DefaultTimeout = 30 * time.Second

// Client talks to one instance manager over one gRPC connection.
type Client struct {
	address string
	conn    *grpc.ClientConn
	im      impb.InstanceManagerClient
	timeout time.Duration
}

// NewClient connects lazily: the first call dials, and gRPC reconnects
// after a failure by itself.
func NewClient(address string, timeout time.Duration) (*Client, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	conn, err := grpc.NewClient(address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Notice a dead instance manager within seconds, even on an idle
		// connection that only carries a Watch.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second,
			PermitWithoutStream: true}),
		grpc.WithUnaryInterceptor(countUnary), grpc.WithStreamInterceptor(countStream))
	if err != nil {
		return nil, fmt.Errorf("instance manager %s: %w", address, err)
	}
	return &Client{address: address, conn: conn, im: impb.NewInstanceManagerClient(conn), timeout: timeout}, nil
}

// Address is the instance manager's gRPC address.
func (c *Client) Address() string { return c.address }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// call runs one unary call with the client's timeout and typed errors.
func call[Req, Resp any](ctx context.Context, c *Client, fn func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := fn(ctx, req)
	return resp, FromStatus(err)
}

func (c *Client) InstanceCreate(ctx context.Context, req *impb.InstanceCreateRequest) (*impb.Instance, error) {
	return call(ctx, c, c.im.InstanceCreate, req)
}

func (c *Client) InstanceDelete(ctx context.Context, name string) (*impb.Instance, error) {
	return call(ctx, c, c.im.InstanceDelete, &impb.InstanceRef{Name: name})
}

func (c *Client) InstanceGet(ctx context.Context, name string) (*impb.Instance, error) {
	return call(ctx, c, c.im.InstanceGet, &impb.InstanceRef{Name: name})
}

func (c *Client) InstanceList(ctx context.Context) ([]*impb.Instance, error) {
	resp, err := call(ctx, c, c.im.InstanceList, &impb.InstanceListRequest{})
	if err != nil {
		return nil, err
	}
	return resp.Instances, nil
}

// Watch streams instance changes until ctx ends or the connection breaks;
// the first events are the current state of every instance.
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

func (c *Client) SnapshotCreate(ctx context.Context, engine, name string, userCreated bool, labels map[string]string) (string, error) {
	resp, err := call(ctx, c, c.im.SnapshotCreate, &impb.SnapshotCreateRequest{Engine: engine, Name: name,
		UserCreated: userCreated, Labels: labels})
	if err != nil {
		return "", err
	}
	return resp.Name, nil
}

func (c *Client) SnapshotList(ctx context.Context, engine string) (map[string]*impb.Snapshot, error) {
	resp, err := call(ctx, c, c.im.SnapshotList, &impb.InstanceRef{Name: engine})
	if err != nil {
		return nil, err
	}
	return resp.Snapshots, nil
}

func (c *Client) SnapshotRemove(ctx context.Context, engine string, names ...string) error {
	_, err := call(ctx, c, c.im.SnapshotRemove, &impb.SnapshotRemoveRequest{Engine: engine, Names: names})
	return err
}

func (c *Client) SnapshotPurge(ctx context.Context, engine string) error {
	_, err := call(ctx, c, c.im.SnapshotPurge, &impb.InstanceRef{Name: engine})
	return err
}

func (c *Client) SnapshotPurgeStatus(ctx context.Context, engine string) (map[string]*impb.PurgeStatus, error) {
	resp, err := call(ctx, c, c.im.SnapshotPurgeStatus, &impb.InstanceRef{Name: engine})
	if err != nil {
		return nil, err
	}
	return resp.Status, nil
}

func (c *Client) SnapshotRevert(ctx context.Context, engine, name string) error {
	_, err := call(ctx, c, c.im.SnapshotRevert, &impb.SnapshotRevertRequest{Engine: engine, Name: name})
	return err
}

// SnapshotClone fills engine's new, empty volume (frontend stopped, no
// snapshots) with snapshot of another volume, read from that volume's
// replica serving dataconn at sourceAddress. It returns when the copy is
// done and flushed, which takes as long as the data needs: it is bounded by
// ctx only, not by the client's unary timeout, so give ctx a deadline that
// fits the volume. Cancelling ctx stops the clone and leaves the target
// partly filled; calling again starts over.
func (c *Client) SnapshotClone(ctx context.Context, engine, sourceAddress, snapshot string) error {
	_, err := c.im.SnapshotClone(ctx, &impb.SnapshotCloneRequest{Engine: engine, SourceAddress: sourceAddress,
		Snapshot: snapshot})
	return FromStatus(err)
}

// SnapshotExport streams a snapshot's data and calls fn for every chunk,
// in order; an error from fn stops the stream and is returned. The first
// chunk carries the volume size. To rebuild the snapshot, start from a
// zeroed image of that size and write each chunk's data at its offset in
// the order received: a later chunk overrides an earlier one at the same
// offsets, and bytes no chunk covers are zero. Each chunk holds at most
// 1 MiB. If SnapshotExport returns an error the image is incomplete. Like
// Watch, it is bounded by ctx, not by the client's unary timeout.
func (c *Client) SnapshotExport(ctx context.Context, engine, snapshot string, fn func(*impb.ExportChunk) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.im.SnapshotExport(ctx, &impb.SnapshotExportRequest{Engine: engine, Snapshot: snapshot})
	if err != nil {
		return FromStatus(err)
	}
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return FromStatus(err)
		}
		if err := fn(chunk); err != nil {
			return err
		}
	}
}

func (c *Client) SnapshotLimitsSet(ctx context.Context, engine string, maxCount int32, maxSize int64) error {
	_, err := call(ctx, c, c.im.SnapshotLimitsSet, &impb.SnapshotLimitsRequest{Engine: engine, MaxCount: maxCount, MaxSize: maxSize})
	return err
}

func (c *Client) VolumeExpand(ctx context.Context, engine string, size int64) error {
	_, err := call(ctx, c, c.im.VolumeExpand, &impb.VolumeExpandRequest{Engine: engine, Size: size})
	return err
}

func (c *Client) FrontendStart(ctx context.Context, engine, frontend string) (*impb.Instance, error) {
	return call(ctx, c, c.im.FrontendStart, &impb.FrontendStartRequest{Engine: engine, Frontend: frontend})
}

func (c *Client) FrontendStop(ctx context.Context, engine string) (*impb.Instance, error) {
	return call(ctx, c, c.im.FrontendStop, &impb.InstanceRef{Name: engine})
}

func (c *Client) ReplicaAdd(ctx context.Context, engine, replica, address string, rebuild bool) error {
	_, err := call(ctx, c, c.im.ReplicaAdd, &impb.ReplicaAddRequest{Engine: engine, Replica: replica, Address: address, Rebuild: rebuild})
	return err
}

func (c *Client) ReplicaRemove(ctx context.Context, engine, replica string) error {
	_, err := call(ctx, c, c.im.ReplicaRemove, &impb.ReplicaRemoveRequest{Engine: engine, Replica: replica})
	return err
}

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
	clients map[string]*Client
}

// NewPool returns an empty pool whose clients use timeout for unary calls.
func NewPool(timeout time.Duration) *Pool {
	return &Pool{timeout: timeout, clients: map[string]*Client{}}
}

// Get returns the pooled client for an address, creating it on first use.
func (p *Pool) Get(address string) (*Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[address]; ok {
		return c, nil
	}
	c, err := NewClient(address, p.timeout)
	if err != nil {
		return nil, err
	}
	p.clients[address] = c
	return c, nil
}

// Forget closes and drops the client of an address that went away.
func (p *Pool) Forget(address string) {
	p.mu.Lock()
	c, ok := p.clients[address]
	delete(p.clients, address)
	p.mu.Unlock()
	if ok {
		_ = c.Close()
	}
}

// Close closes every client.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.clients {
		_ = c.Close()
		delete(p.clients, addr)
	}
}
