package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"

	dto "github.com/prometheus/client_model/go"

	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
)

// replicaLatency prints, for one volume's engine, each replica's count and
// p50/p99 of op from the instance manager's
// strata_engine_replica_io_duration_seconds: where the engine waits.
func replicaLatency(ctx context.Context, c *engineapi.Client, volume, op string) error {
	families, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	hists := replication.ReplicaHistograms(families, volume, op)
	if len(hists) == 0 {
		return fmt.Errorf("no %s latency series for volume %s", op, volume)
	}
	for _, r := range slices.Sorted(maps.Keys(hists)) {
		h := hists[r]
		fmt.Printf("%s %d %.0f %.0f\n", r, h.GetSampleCount(), quantile(h, 0.5)*1e6, quantile(h, 0.99)*1e6)
	}
	return nil
}

// quantile estimates q from cumulative buckets by linear interpolation
// inside the bucket that holds it, as PromQL's histogram_quantile does.
func quantile(h *dto.Histogram, q float64) float64 {
	total := float64(h.GetSampleCount())
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		upper, cum := b.GetUpperBound(), float64(b.GetCumulativeCount())
		if cum >= rank {
			if cum == below {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/(cum-below)
		}
		lower, below = upper, cum
	}
	return lower // beyond the last finite bucket
}
