package replication

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A replica the engine could not connect is listed in ERR with its cause,
// takes no I/O, and is removed like any other.
func TestAddFailedReplica(t *testing.T) {
	e, reps, changes := newTestEngine(t, ModeRW)
	cause := errors.New("connection refused")
	require.NoError(t, e.AddFailedReplica("r9", "addr9", cause))
	assert.Positive(t, changes.Load(), "watchers told")
	assert.Error(t, e.AddFailedReplica("r9", "addr9", cause), "names stay unique")
	assert.Error(t, e.AddReplica("r9", "addr9", newMemReplica(testSize), ModeRW), "names stay unique")

	got := e.Replicas()
	require.Len(t, got, 2)
	assert.Equal(t, ReplicaStatus{Name: "r9", Address: "addr9", Mode: ModeERR, Error: "connection refused"}, got[1])

	_, err := e.WriteAt([]byte{1}, 0)
	require.NoError(t, err, "the volume serves with the replica it has")
	_, err = e.ReadAt(make([]byte, 1), 0)
	require.NoError(t, err)
	require.NoError(t, e.Flush())
	assert.Equal(t, []Mode{ModeRW, ModeERR}, modes(e), "the ERR replica got no I/O to fail")
	assert.EqualValues(t, 1, reps[0].writes.Load())

	require.NoError(t, e.RemoveReplica("r9"))
	assert.Equal(t, []Mode{ModeRW}, modes(e))
}

// DataVersion moves after every call that may change data, failed or not,
// and after nothing else, so a size reporter can skip idle volumes.
func TestDataVersion(t *testing.T) {
	tests := []struct {
		name  string
		fail  bool
		op    func(*Engine) error
		moves bool
	}{
		{"write", false, func(e *Engine) error { _, err := e.WriteAt([]byte{1}, 0); return err }, true},
		{"failed write", true, func(e *Engine) error { _, err := e.WriteAt([]byte{1}, 0); return err }, true},
		{"unmap", false, func(e *Engine) error { return e.Unmap(0, 4096) }, true},
		{"write zeroes", false, func(e *Engine) error { return e.WriteZeroes(0, 4096) }, true},
		{"read", false, func(e *Engine) error { _, err := e.ReadAt(make([]byte, 1), 0); return err }, false},
		{"flush", false, func(e *Engine) error { return e.Flush() }, false},
		{"write out of range", false, func(e *Engine) error { _, err := e.WriteAt([]byte{1}, testSize); return err }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, reps, _ := newTestEngine(t, ModeRW)
			reps[0].failIO.Store(tc.fail)
			before := e.DataVersion()
			_ = tc.op(e)
			assert.Equal(t, tc.moves, e.DataVersion() != before)
		})
	}
}
