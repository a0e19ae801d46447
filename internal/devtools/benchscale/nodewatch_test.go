package benchscale

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func TestClassifyNodeWrite(t *testing.T) {
	const mib = int64(1) << 20
	const fullRest = " bytes free after the 0 reserved, less than 1% of 1000 (setting storage-minimal-available-percentage)"
	node := func(free int64, schedulable metav1.ConditionStatus, reason, msg string) *v1beta1.Node {
		return &v1beta1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "node-1", ResourceVersion: "1"},
			Status: v1beta1.NodeStatus{DiskStatus: map[string]*v1beta1.DiskStatus{"disk-1": {
				DiskUUID: "u", StorageMaximum: 1000 * mib, StorageAvailable: free,
				Conditions: []metav1.Condition{{Type: v1beta1.ConditionTypeSchedulable, Status: schedulable, Reason: reason, Message: msg}},
			}}},
		}
	}
	ok := func(free int64) *v1beta1.Node {
		return node(free, metav1.ConditionTrue, v1beta1.DiskConditionReasonSchedulable, "disk can take new replicas")
	}
	full := func(free int64, msg string) *v1beta1.Node {
		return node(free, metav1.ConditionFalse, v1beta1.DiskConditionReasonFull, msg)
	}
	tests := []struct {
		name      string
		old, cur  *v1beta1.Node
		cause     string
		wantDelta float64
	}{
		{"free space moved", ok(500 * mib), ok(200 * mib), causeFreeSpace, -300},
		{"a Full message's bytes moved too", full(9*mib, "9437184"+fullRest), full(8*mib, "8388608"+fullRest), causeFreeSpace, -1},
		{"the disk became Full", ok(20 * mib), full(8*mib, "8388608"+fullRest), causeConditions, -12},
		{"the disk size changed", ok(500 * mib), func() *v1beta1.Node {
			n := ok(500 * mib)
			n.Status.DiskStatus["disk-1"].StorageMaximum = 2000 * mib
			return n
		}(), causeOther, 0},
		{"nothing but metadata", ok(500 * mib), func() *v1beta1.Node {
			n := ok(500 * mib)
			n.ResourceVersion = "2"
			n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "m", Time: &metav1.Time{Time: time.Unix(1, 0)}}}
			return n
		}(), causeOther, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cur.ResourceVersion = "2"
			w := classifyNodeWrite(tc.old, tc.cur)
			if w.cause != tc.cause {
				t.Errorf("cause %q, want %q", w.cause, tc.cause)
			}
			var delta float64
			if len(w.deltaMiB) > 0 {
				delta = w.deltaMiB[0]
			}
			if delta != tc.wantDelta {
				t.Errorf("free delta %v MiB, want %v", delta, tc.wantDelta)
			}
		})
	}
}

func TestFreeSpaceAllowance(t *testing.T) {
	for _, tc := range []struct {
		window time.Duration
		want   int
	}{{time.Minute, 1}, {5 * time.Minute, 2}, {11 * time.Minute, 3}} {
		if got := freeSpaceAllowance(tc.window); got != tc.want {
			t.Errorf("freeSpaceAllowance(%s) = %d, want %d", tc.window, got, tc.want)
		}
	}
}
