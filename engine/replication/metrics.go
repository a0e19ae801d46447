package replication

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// ReplicaIODuration shows where an engine waits: a write returns when the
// slowest writer has it, so a replica whose histogram sits right of the
// others' is the one the volume waits for. Labels stay bounded by the
// engines of one instance manager times their replicas; a replica's series
// go when it leaves the engine.
var ReplicaIODuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    replicaIODurationName,
	Help:    "How long one replica took to answer the engine's reads and writes, by volume, replica and operation.",
	Buckets: prometheus.ExponentialBuckets(25e-6, 2.5, 12), // 25 µs … 0.6 s
}, []string{"volume", "replica", "op"})

const replicaIODurationName = "strata_engine_replica_io_duration_seconds"

// ReplicaHistograms picks one volume's histograms of op ("read" or
// "write"), by replica, out of gathered families (what the instance
// manager's Metrics call returns).
func ReplicaHistograms(families []*dto.MetricFamily, volume, op string) map[string]*dto.Histogram {
	out := map[string]*dto.Histogram{}
	for _, f := range families {
		if f.GetName() != replicaIODurationName {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["volume"] == volume && labels["op"] == op {
				out[labels["replica"]] = m.GetHistogram()
			}
		}
	}
	return out
}

// replicaTimers are a replica's observers, looked up once when it joins so
// the I/O path does no label lookups.
type replicaTimers struct{ read, write prometheus.Observer }

func newReplicaTimers(volume, replica string) replicaTimers {
	return replicaTimers{
		read:  ReplicaIODuration.WithLabelValues(volume, replica, "read"),
		write: ReplicaIODuration.WithLabelValues(volume, replica, "write"),
	}
}

func forgetReplicaTimers(volume, replica string) {
	ReplicaIODuration.DeletePartialMatch(prometheus.Labels{"volume": volume, "replica": replica})
}

func observeSince(o prometheus.Observer, start time.Time) {
	if o != nil { // nil for a replica listed as failed, which gets no I/O
		o.Observe(time.Since(start).Seconds())
	}
}
