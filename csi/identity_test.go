package csi

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/strata-storage/strata/csi/nbddev"
)

func TestNewDriverChecksOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"node needs no datastore", Options{Mode: ModeNode, NodeID: "n1", Version: "v1", Connector: &nbddev.FUSELoop{}}, ""},
		{"node needs a connector", Options{Mode: ModeNode, NodeID: "n1", Version: "v1"}, "needs a block-device connector"},
		{"controller needs a datastore", Options{Mode: ModeController, Version: "v1"}, "needs a datastore"},
		{"node needs its name", Options{Mode: ModeNode, Version: "v1"}, "needs the node name"},
		{"empty vendor version", Options{Mode: ModeBoth, NodeID: "n1"}, "empty vendor version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDriver(tc.opts)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"controller", "node", "both"} {
		m, err := ParseMode(s)
		require.NoError(t, err)
		assert.Equal(t, Mode(s), m)
	}
	_, err := ParseMode("all")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `--mode "all"`)
}

// The identity and node-info calls over the real socket, as a sidecar or
// the kubelet makes them.
func TestIdentityAndNodeInfoOverTheSocket(t *testing.T) {
	d, err := NewDriver(Options{Mode: ModeNode, NodeID: "node-2", Version: "v9", Log: logrus.New(), Connector: &nbddev.FUSELoop{}})
	require.NoError(t, err)
	socket := filepath.Join(t.TempDir(), "csi.sock")
	conn := serveForTest(t, socket, d.Serve)

	identity := csi.NewIdentityClient(conn)
	info, err := identity.GetPluginInfo(t.Context(), &csi.GetPluginInfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, DriverName, info.Name)
	assert.Equal(t, "v9", info.VendorVersion)

	probe, err := identity.Probe(t.Context(), &csi.ProbeRequest{})
	require.NoError(t, err)
	assert.False(t, probe.Ready.GetValue(), "not ready before the caches sync")
	d.SetReady(true)
	probe, err = identity.Probe(t.Context(), &csi.ProbeRequest{})
	require.NoError(t, err)
	assert.True(t, probe.Ready.GetValue())

	caps, err := identity.GetPluginCapabilities(t.Context(), &csi.GetPluginCapabilitiesRequest{})
	require.NoError(t, err)
	assert.Empty(t, caps.Capabilities, "a node-only plugin offers no controller service")

	nodeInfo, err := csi.NewNodeClient(conn).NodeGetInfo(t.Context(), &csi.NodeGetInfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, "node-2", nodeInfo.NodeId)
	assert.Equal(t, map[string]string{TopologyNodeKey: "node-2"}, nodeInfo.AccessibleTopology.Segments)
}

func TestRegistrarAnnouncesTheCSISocket(t *testing.T) {
	root := t.TempDir()
	r := NewRegistrar("/var/lib/kubelet/plugins/driver.strata.io/csi.sock", logrus.New())
	conn := serveForTest(t, RegistrationSocket(root), r.Serve)
	client := registerapi.NewRegistrationClient(conn)
	info, err := client.GetInfo(t.Context(), &registerapi.InfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, registerapi.CSIPlugin, info.Type)
	assert.Equal(t, DriverName, info.Name)
	assert.Equal(t, "/var/lib/kubelet/plugins/driver.strata.io/csi.sock", info.Endpoint)
	_, err = client.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true})
	require.NoError(t, err)
}

// A socket file left by a killed process is replaced; a live one is not.
func TestListenUnixReplacesOnlyStaleSockets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := listenUnix(path)
	require.NoError(t, err)
	_, err = listenUnix(path)
	require.Error(t, err, "a socket something answers on is kept")
	assert.Contains(t, err.Error(), "another process serves")
	l.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false) // as a process killed with -9 would leave it
	require.NoError(t, l.Close())
	l, err = listenUnix(path)
	require.NoError(t, err, "a stale socket is replaced")
	require.NoError(t, l.Close())
}

func serveForTest(t *testing.T, socket string, serve func(context.Context, string) error) *grpc.ClientConn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, socket) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	// WaitForReady: the server goroutine may not listen yet.
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}
