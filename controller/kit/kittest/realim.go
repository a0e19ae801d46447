package kittest

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engine/imserver"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RealIM is a real instance manager in this process, reached over gRPC, with
// an instance cache fed by its Watch stream as the InstanceManager
// controller feeds it: the engine and replica controllers are tested against
// the real data plane, not a mock.
type RealIM struct {
	Addr  string
	Pool  *engineapi.Pool
	Cache *kit.InstanceCache
}

func StartRealIM(t *testing.T) *RealIM {
	t.Helper()
	return StartRealIMWith(t, RealIMOptions{SizeReportInterval: -1})
}

// RealIMOptions tunes startRealIMWith: how often the instance manager
// re-reads its engines' chains and follows purges (negative: never), and
// gRPC server options such as an interceptor that injects faults.
type RealIMOptions struct {
	SizeReportInterval time.Duration
	ServerOptions      []grpc.ServerOption
}

func StartRealIMWith(t *testing.T, o RealIMOptions) *RealIM {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	// The tests' disks are t.TempDir()s.
	srv, err := imserver.New(imserver.Options{StateDir: t.TempDir(), DiskPaths: []string{os.TempDir()},
		DataHost: "127.0.0.1", NBDSocket: "/run/strata/nbd.sock", Log: log, SizeReportInterval: o.SizeReportInterval})
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer(o.ServerOptions...)
	impb.RegisterInstanceManagerServer(gs, srv)
	go func() { _ = gs.Serve(l) }()
	im := &RealIM{Addr: l.Addr().String(), Pool: engineapi.NewPool(10*time.Second, nil), Cache: kit.NewInstanceCache()}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); im.Pool.Close(); gs.Stop(); _ = srv.Close() })
	client, err := im.Pool.Get(im.Addr)
	require.NoError(t, err)
	next, err := client.DataPlane().Watch(ctx)
	require.NoError(t, err)
	im.Cache.StreamOpened()
	go func() {
		for {
			ev, err := next()
			if err != nil {
				return
			}
			im.Cache.Apply(ev)
		}
	}()
	require.Eventually(t, im.Cache.Synced, 10*time.Second, 10*time.Millisecond)
	return im
}

// WaitInstance waits until the cache shows the instance in the given state
// (found=false: gone).
func (im *RealIM) WaitInstance(t *testing.T, name string, found bool, state engineapi.InstanceState) {
	t.Helper()
	require.Eventually(t, func() bool {
		inst, ok, _ := im.Cache.Get(name)
		return ok == found && (!found || inst.State == state)
	}, 10*time.Second, 10*time.Millisecond, "instance %s found=%v state=%s", name, found, state)
}

func (im *RealIM) Instances() *kit.InstanceCache { return im.Cache }

// StartReplicas starts 4 MiB replicas of volume v1 with their data in disk
// and returns their data addresses by name.
func (im *RealIM) StartReplicas(t *testing.T, disk string, names ...string) map[string]string {
	t.Helper()
	dp, err := im.Pool.DataPlane(im.Addr)
	require.NoError(t, err)
	addrs := map[string]string{}
	for _, name := range names {
		inst, err := dp.InstanceCreate(context.Background(), engineapi.InstanceSpec{Name: name, Type: engineapi.InstanceTypeReplica,
			VolumeName: "v1", Size: 4 << 20, DataDir: filepath.Join(disk, name)})
		require.NoError(t, err)
		addrs[name] = inst.Address
	}
	return addrs
}

// LostStream is an instance cache whose stream has failed: the instance
// manager is unreachable.
func LostStream() *kit.InstanceCache {
	c := kit.NewInstanceCache()
	c.StreamLost()
	return c
}

// ImageCondition gives the volume the BackingImageReady condition a verdict gives.
func ImageCondition(bi *v1beta1.BackingImage) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		ok, reason, msg := kit.BackingImageVerdict("img", bi)
		kit.SetCondition(&v.Status.Conditions, kit.VolumeConditionBackingImageReady, ok, reason, msg, metav1.NewTime(dstest.Now))
	}
}
