package app

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A stream that never ends (as the managers' Watch) does not hold the
// shutdown past the timeout; without one, the stop is graceful.
func TestStopGRPC(t *testing.T) {
	tests := []struct {
		name       string
		openStream bool
	}{
		{name: "an open stream: stopped after the timeout", openStream: true},
		{name: "no call running: graceful at once"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			gs := grpc.NewServer()
			healthpb.RegisterHealthServer(gs, health.NewServer())
			go func() { _ = gs.Serve(ln) }()
			if tc.openStream {
				conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
				require.NoError(t, err)
				defer conn.Close()
				stream, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
				require.NoError(t, err)
				_, err = stream.Recv() // the first status: the stream is open on the server
				require.NoError(t, err)
			}
			const timeout = 300 * time.Millisecond
			start := time.Now()
			stopGRPC(gs, timeout)
			took := time.Since(start)
			assert.Less(t, took, timeout+2*time.Second, "the stop is bounded")
			if tc.openStream {
				assert.GreaterOrEqual(t, took, timeout, "running calls get the timeout to finish")
			}
		})
	}
}
