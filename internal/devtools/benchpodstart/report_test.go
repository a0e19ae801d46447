package benchpodstart

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The CSI logs' lines are read for one volume: its calls' durations added
// up by method, its failed calls counted, other volumes' lines skipped.
func TestScanCSILog(t *testing.T) {
	log := `time="2026-11-26T16:00:00Z" level=info msg="CSI call" method=/csi.v1.Controller/CreateVolume name=pvc-1 took=120ms
time="2026-11-26T16:00:01Z" level=info msg="CSI call" method=/csi.v1.Controller/ControllerPublishVolume took=1.5s volume=pvc-1
time="2026-11-26T16:00:01Z" level=info msg="CSI call" method=/csi.v1.Controller/ControllerPublishVolume took=9s volume=pvc-2
time="2026-11-26T16:00:02Z" level=warning msg="CSI call failed" error="rpc error: not attached" method=/csi.v1.Node/NodeStageVolume took=3ms volume=pvc-1
time="2026-11-26T16:00:03Z" level=info msg="CSI call" method=/csi.v1.Node/NodeStageVolume took=800ms volume=pvc-1
time="2026-11-26T16:00:03Z" level=info msg="Staged volume" volume=pvc-1
`
	path := filepath.Join(t.TempDir(), "csi-node.log")
	require.NoError(t, os.WriteFile(path, []byte(log), 0o644))
	s := &sample{csi: map[string]time.Duration{}}
	require.NoError(t, scanCSILog(path, "pvc-1", "pvc-1", s))
	assert.Equal(t, map[string]time.Duration{"CreateVolume": 120 * time.Millisecond,
		"ControllerPublishVolume": 1500 * time.Millisecond, "NodeStageVolume": 800 * time.Millisecond}, s.csi)
	assert.Equal(t, 1, s.failed)
}

func TestMedianMax(t *testing.T) {
	mk := func(ds ...time.Duration) []*sample {
		var out []*sample
		for _, d := range ds {
			out = append(out, &sample{csi: map[string]time.Duration{"x": d}})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []*sample
		want string
	}{
		{"none", nil, "—"},
		{"one", mk(time.Second), "1.00 / 1.00"},
		{"three", mk(3*time.Second, time.Second, 2*time.Second), "2.00 / 3.00"},
		{"unseen left out", mk(-1, 500*time.Millisecond), "0.50 / 0.50"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, medianMax(tc.in, func(s *sample) time.Duration { return s.csi["x"] }))
		})
	}
}
