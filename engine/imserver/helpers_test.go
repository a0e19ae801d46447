package imserver

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

const mib = 1 << 20

// testIM is an instance manager in this process, reached over real gRPC
// through engineapi, so typed errors make the whole round trip.
type testIM struct {
	s        *Server
	c        *engineapi.Client
	gs       *grpc.Server
	opts     Options
	diskDir  string
	listener string
}

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// testNBDSocket is the test instance managers' NBD socket: only named in
// endpoints, since the tests serve no NBD.
const testNBDSocket = "/run/strata/nbd.sock"

// newTestIM starts an instance manager. The size reporter is off unless
// opts asks for it, so other tests see no background events.
func newTestIM(t *testing.T, opts Options) *testIM {
	t.Helper()
	dir := t.TempDir()
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(dir, "state")
	}
	if opts.SizeReportInterval == 0 {
		opts.SizeReportInterval = -1
	}
	// Tests keep replicas, backing files and file:// targets in their own
	// t.TempDir()s; confinement itself is tested with a narrow disk
	// (confine_test.go).
	if opts.DiskPaths == nil {
		opts.DiskPaths = []string{os.TempDir()}
	}
	if opts.BackupPaths == nil {
		opts.BackupPaths = []string{os.TempDir()}
	}
	if opts.NBDSocket == "" {
		opts.NBDSocket = testNBDSocket
	}
	opts.DataHost, opts.Log = "127.0.0.1", quietLog()
	im := &testIM{opts: opts, diskDir: filepath.Join(dir, "disk")}
	im.start(t)
	t.Cleanup(func() { im.stop(t) })
	return im
}

func (im *testIM) start(t *testing.T) {
	t.Helper()
	s, err := New(im.opts)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	impb.RegisterInstanceManagerServer(gs, s)
	go func() { _ = gs.Serve(l) }()
	c, err := engineapi.NewClient(l.Addr().String(), 20*time.Second, nil)
	require.NoError(t, err)
	im.s, im.c, im.gs, im.listener = s, c, gs, l.Addr().String()
}

// stop closes the instance manager as a shutdown would; start reopens it
// from the same state directory.
func (im *testIM) stop(t *testing.T) {
	if im.s == nil {
		return
	}
	_ = im.c.Close()
	im.gs.Stop()
	_ = im.s.Close()
	im.s = nil
}

func (im *testIM) replicaDir(name string) string { return filepath.Join(im.diskDir, name) }

func (im *testIM) createReplica(t *testing.T, name string, size int64) *impb.Instance {
	t.Helper()
	inst, err := im.c.InstanceCreate(context.Background(), replicaReq(name, im.replicaDir(name), size))
	require.NoError(t, err)
	require.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, inst.State)
	return inst
}

func replicaReq(name, dir string, size int64) *impb.InstanceCreateRequest {
	return &impb.InstanceCreateRequest{Name: name, Type: impb.InstanceType_INSTANCE_TYPE_REPLICA,
		VolumeName: "vol", Size: size, DataDir: dir}
}

func engineReq(name string, size int64, replicas map[string]string) *impb.InstanceCreateRequest {
	return &impb.InstanceCreateRequest{Name: name, Type: impb.InstanceType_INSTANCE_TYPE_ENGINE,
		VolumeName: "vol", Size: size, Replicas: replicas}
}

// engine returns a running engine's replication.Engine, to do I/O on it
// the way the NBD frontend would.
func (im *testIM) engine(t *testing.T, name string) *replication.Engine {
	t.Helper()
	_, eng, err := im.s.runningEngine(name)
	require.NoError(t, err)
	return eng
}

func pattern(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func readAt(t *testing.T, eng *replication.Engine, off int64, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	_, err := eng.ReadAt(p, off)
	require.NoError(t, err)
	return p
}

// unusedAddress is a local address nothing listens on: dialing it is
// refused at once.
func unusedAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// watcher collects an instance manager's Watch events after the initial
// sync marker.
type watcher struct {
	events chan *impb.WatchEvent
	errc   chan error
}

func (im *testIM) watch(t *testing.T) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	next, err := im.c.Watch(ctx)
	require.NoError(t, err)
	for {
		ev, err := next()
		require.NoError(t, err)
		if ev.Kind == impb.WatchEvent_KIND_SYNCED {
			break
		}
	}
	w := &watcher{events: make(chan *impb.WatchEvent, 1000), errc: make(chan error, 1)}
	go func() {
		for {
			ev, err := next()
			if err != nil {
				w.errc <- err
				return
			}
			w.events <- ev
		}
	}()
	return w
}

// until waits for an event of the instance that satisfies cond.
func (w *watcher) until(t *testing.T, name, what string, timeout time.Duration, cond func(*impb.Instance) bool) *impb.Instance {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev := <-w.events:
			if ev.Instance.GetName() == name && cond(ev.Instance) {
				return ev.Instance
			}
		case err := <-w.errc:
			t.Fatalf("watch ended waiting for %s: %v", what, err)
		case <-deadline:
			t.Fatalf("no Watch event with %s within %v", what, timeout)
		}
	}
}
