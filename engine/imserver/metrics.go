package imserver

import (
	"bytes"
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi/impb"
)

// metrics holds this process's series. The instance manager has no
// listener of its own for them: the node's manager gathers them over the
// authenticated control API and serves them beside its own, so Prometheus
// scrapes one authenticated endpoint per node.
var metrics = func() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(replication.ReplicaIODuration)
	return r
}()

// Metrics returns the series in the Prometheus protobuf exposition format.
func (s *Server) Metrics(context.Context, *impb.Empty) (*impb.MetricsResponse, error) {
	families, err := metrics.Gather()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "gathering metrics: %v", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeProtoDelim))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			return nil, status.Errorf(codes.Internal, "encoding metric %s: %v", f.GetName(), err)
		}
	}
	return &impb.MetricsResponse{Families: buf.Bytes()}, nil
}
