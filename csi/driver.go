// Package csi is Strata's CSI driver (driver.strata.io): the identity,
// controller and node services on one gRPC server on a unix socket, and the
// node plugin's registration with its kubelet. It is run by
// `strata-manager csi`.
package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"

	"github.com/strata-storage/strata/csi/nbddev"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/fsfreeze"
	"github.com/strata-storage/strata/internal/unixsock"
	"github.com/strata-storage/strata/types"
)

// DriverName is the CSI driver name: StorageClasses' provisioner, CSIDriver
// object, PersistentVolumes' spec.csi.driver.
const DriverName = types.CSIDriverName

// TopologyNodeKey is the topology segment a volume's node reachability is
// expressed in: the Strata node name.
const TopologyNodeKey = "topology.strata.io/node"

// Mode says which CSI services a plugin process serves.
type Mode string

const (
	ModeController Mode = "controller"
	ModeNode       Mode = "node"
	ModeBoth       Mode = "both"
)

// ParseMode checks a --mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeController, ModeNode, ModeBoth:
		return m, nil
	}
	return "", fmt.Errorf("--mode %q: must be controller, node or both", s)
}

func (m Mode) node() bool       { return m == ModeNode || m == ModeBoth }
func (m Mode) controller() bool { return m == ModeController || m == ModeBoth }

// Options configures a Driver.
type Options struct {
	NodeID  string // the Strata node this plugin runs on (node mode)
	Mode    Mode
	Version string // vendor_version; must not be empty
	// Store is the cache the services read and the client they write
	// through; required in controller mode.
	Store *datastore.DataStore
	// Connector turns NBD exports into block devices; required in node mode.
	Connector nbddev.Connector
	// Blocks answers the SnapshotMetadata service (controller mode); nil
	// serves none and leaves its capability out.
	Blocks BlocksSource
	// Freezer holds the node's filesystem freezes (node mode; nil: none):
	// a volume is thawed before it is unstaged.
	Freezer *fsfreeze.Freezer
	Log     logrus.FieldLogger
}

// Driver serves the CSI services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedGroupControllerServer
	csi.UnimplementedNodeServer
	csi.UnimplementedSnapshotMetadataServer

	opts  Options
	ds    *datastore.DataStore
	node  *nodeService
	log   logrus.FieldLogger
	ready atomic.Bool // Probe answers ready once the caches have synced
}

// NewDriver checks opts and returns a Driver that is not ready yet.
func NewDriver(opts Options) (*Driver, error) {
	if opts.Version == "" {
		return nil, errors.New("CSI driver: an empty vendor version is not allowed")
	}
	if opts.Mode.node() && opts.NodeID == "" {
		return nil, errors.New("CSI driver: node mode needs the node name (--node-name)")
	}
	if opts.Mode.controller() && opts.Store == nil {
		return nil, errors.New("CSI driver: controller mode needs a datastore")
	}
	if opts.Mode.node() && opts.Connector == nil {
		return nil, errors.New("CSI driver: node mode needs a block-device connector")
	}
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	d := &Driver{opts: opts, ds: opts.Store, log: opts.Log.WithFields(logrus.Fields{"component": "csi", "mode": opts.Mode})}
	if opts.Mode.node() {
		d.node = newNodeService(opts.Connector)
	}
	return d, nil
}

// SetReady flips what Probe answers.
func (d *Driver) SetReady(ready bool) { d.ready.Store(ready) }

// Serve serves the driver's services on the unix socket at path until ctx
// ends. A socket left by an earlier, killed process is replaced.
func (d *Driver) Serve(ctx context.Context, path string) error {
	l, err := listenUnix(path)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(d.logCalls))
	csi.RegisterIdentityServer(srv, d)
	if d.opts.Mode.controller() {
		csi.RegisterControllerServer(srv, d)
		csi.RegisterGroupControllerServer(srv, d)
		if d.opts.Blocks != nil {
			csi.RegisterSnapshotMetadataServer(srv, d)
		}
	}
	if d.opts.Mode.node() {
		csi.RegisterNodeServer(srv, d)
	}
	d.log.WithField("socket", path).Info("Serving CSI")
	return serveUntilDone(ctx, srv, l)
}

// listenUnix listens on a unix socket, replacing a stale socket file (one
// left by a killed process) but not a live one.
func listenUnix(path string) (net.Listener, error) {
	l, err := unixsock.Listen(path, unixsock.Options{DirMode: 0o750})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// serveUntilDone serves until ctx ends, then stops gracefully.
func serveUntilDone(ctx context.Context, srv *grpc.Server, l net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case <-ctx.Done():
		srv.GracefulStop()
		return nil
	case err := <-errc:
		return err
	}
}

// logCalls logs every CSI call with its outcome: the sidecars retry, and
// the log is where an admin sees why.
func (d *Driver) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	entry := d.log.WithFields(logrus.Fields{"method": info.FullMethod, "took": time.Since(start).Round(time.Millisecond)})
	// A volume's lifecycle calls say which volume, at info: how long each
	// step of a Pod's start took is read from here (scripts/bench-pod-start).
	lifecycle := false
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		entry = entry.WithField("volume", r.GetVolumeId())
		lifecycle = !strings.HasSuffix(info.FullMethod, "Stats") && !strings.HasSuffix(info.FullMethod, "GetVolume")
	}
	if r, ok := req.(interface{ GetName() string }); ok { // CreateVolume, CreateSnapshot
		entry = entry.WithField("name", r.GetName())
		lifecycle = true
	}
	switch {
	case err != nil:
		entry.WithError(err).Warn("CSI call failed")
	case lifecycle:
		entry.Info("CSI call")
	default:
		entry.Debug("CSI call")
	}
	return resp, err
}
