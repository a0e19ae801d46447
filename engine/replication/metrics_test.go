package replication

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replicaSamples is how many observations a replica's series of op holds.
func replicaSamples(t *testing.T, volume, replica, op string) uint64 {
	t.Helper()
	o, err := ReplicaIODuration.GetMetricWithLabelValues(volume, replica, op)
	require.NoError(t, err)
	var m dto.Metric
	require.NoError(t, o.(prometheus.Metric).Write(&m))
	return m.GetHistogram().GetSampleCount()
}

// Every writer times each write, only the replica read times a read, and a
// replica's series leave with it.
func TestReplicaIOLatencySeries(t *testing.T) {
	ReplicaIODuration.Reset()
	e, _, _ := newTestEngine(t, ModeRW, ModeWO)
	for range 3 {
		_, err := e.WriteAt(make([]byte, 4096), 0)
		require.NoError(t, err)
	}
	_, err := e.ReadAt(make([]byte, 4096), 0)
	require.NoError(t, err)

	tests := []struct {
		replica, op string
		want        uint64
	}{
		{"r0", "write", 3}, {"r1", "write", 3}, // the WO replica takes writes
		{"r0", "read", 1}, {"r1", "read", 0}, // and no reads
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, replicaSamples(t, "vol", tc.replica, tc.op), "%s %s", tc.replica, tc.op)
	}

	require.NoError(t, e.RemoveReplica("r1"))
	assert.Equal(t, 2, testutil.CollectAndCount(ReplicaIODuration), "r0's read and write series stay, r1's are gone")
}
