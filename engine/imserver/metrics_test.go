package imserver

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/replication"
)

// The engine's per-replica latency reaches a client of the control API:
// one write series per replica, each holding the engine's writes.
func TestMetricsCarryTheEnginesReplicaLatency(t *testing.T) {
	im := newTestIM(t, Options{})
	const size = 1 << 20
	r1, r2 := im.createReplica(t, "mr1", size), im.createReplica(t, "mr2", size)
	_, err := im.c.InstanceCreate(context.Background(), engineReq("me", size, map[string]string{"mr1": r1.Address, "mr2": r2.Address}))
	require.NoError(t, err)
	eng := im.engine(t, "me")
	for range 5 {
		_, err := eng.WriteAt(pattern(1, 4096), 0)
		require.NoError(t, err)
	}

	families, err := im.c.Metrics(context.Background())
	require.NoError(t, err)
	writes := map[string]uint64{}
	for replica, h := range replication.ReplicaHistograms(families, "vol", "write") {
		writes[replica] = h.GetSampleCount()
	}
	assert.Equal(t, map[string]uint64{"mr1": 5, "mr2": 5}, writes)
}
