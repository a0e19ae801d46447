package engineapi

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// The calls this process makes to instance managers, by gRPC method (a
// Watch counts once, when opened). The manager serves them on /metrics;
// scripts/bench-scale reads CallsTotal to show that status syncs make no
// calls.
var (
	CallsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_engineapi_calls_total",
		Help: "Calls made to instance managers, by gRPC method.",
	}, []string{"method"})
	CallErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_engineapi_call_errors_total",
		Help: "Calls to instance managers that failed, by gRPC method and status code.",
	}, []string{"method", "code"})
	CallDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "strata_engineapi_call_duration_seconds",
		Help:    "How long unary calls to instance managers took, by gRPC method.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10), // 0.5 ms … 131 s
	}, []string{"method"})
)

// Collectors are the series above, for the manager to register.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{CallsTotal, CallErrors, CallDuration}
}

func countUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	CallsTotal.WithLabelValues(method).Inc()
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	CallDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	if err != nil {
		CallErrors.WithLabelValues(method, status.Code(err).String()).Inc()
	}
	return err
}

func countStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	CallsTotal.WithLabelValues(method).Inc()
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		CallErrors.WithLabelValues(method, status.Code(err).String()).Inc()
	}
	return s, err
}
