package engineapi

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// CallsTotal counts the calls this process made to instance managers, by
// gRPC method (a Watch counts once, when opened). The manager serves it on
// /metrics; scripts/bench-scale reads it to show that status syncs make no
// calls.
var CallsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "strata_engineapi_calls_total",
	Help: "Calls made to instance managers, by gRPC method.",
}, []string{"method"})

func countUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	CallsTotal.WithLabelValues(method).Inc()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func countStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	CallsTotal.WithLabelValues(method).Inc()
	return streamer(ctx, desc, cc, method, opts...)
}
