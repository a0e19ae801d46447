package node

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// reportedDisk is a disk status as syncOwnNode writes it for a ready disk.
func reportedDisk(uuid string, total, available int64, schedulable bool, reason, msg string) *v1beta1.DiskStatus {
	st := &v1beta1.DiskStatus{DiskUUID: uuid, StorageMaximum: total, StorageAvailable: available}
	now := metav1.NewTime(dstest.Now)
	kit.SetCondition(&st.Conditions, v1beta1.ConditionTypeReady, true, v1beta1.DiskConditionReasonReady, "disk is ready", now)
	kit.SetCondition(&st.Conditions, v1beta1.ConditionTypeSchedulable, schedulable, reason, msg, now)
	return st
}

func schedulableDisk(available int64) *v1beta1.DiskStatus {
	return reportedDisk("uuid-1", 100*fixture.GiB, available, true, v1beta1.DiskConditionReasonSchedulable, "disk can take new replicas")
}

func fullDisk(available int64, msg string) *v1beta1.DiskStatus {
	return reportedDisk("uuid-1", 100*fixture.GiB, available, false, v1beta1.DiskConditionReasonFull, msg)
}

func TestDiskStatusOnlyFreeSpaceMoved(t *testing.T) {
	type disks = map[string]*v1beta1.DiskStatus
	const fullMsg = " bytes free after the 0 reserved, less than 25% of 107374182400 (setting storage-minimal-available-percentage)"
	tests := []struct {
		name       string
		old, fresh disks
		want       bool
	}{
		{"nothing changed", disks{"d": schedulableDisk(50 * fixture.GiB)}, disks{"d": schedulableDisk(50 * fixture.GiB)}, false},
		{"only the available bytes moved", disks{"d": schedulableDisk(50 * fixture.GiB)}, disks{"d": schedulableDisk(49 * fixture.GiB)}, true},
		{"a Full disk's message moved with its bytes", disks{"d": fullDisk(20*fixture.GiB, "21474836480"+fullMsg)},
			disks{"d": fullDisk(19*fixture.GiB, "20401094656"+fullMsg)}, true},
		{"one disk of two moved", disks{"a": schedulableDisk(50 * fixture.GiB), "b": schedulableDisk(10 * fixture.GiB)},
			disks{"a": schedulableDisk(50 * fixture.GiB), "b": schedulableDisk(9 * fixture.GiB)}, true},
		{"the Schedulable status flipped", disks{"d": schedulableDisk(26 * fixture.GiB)},
			disks{"d": fullDisk(24*fixture.GiB, "25769803776"+fullMsg)}, false},
		{"the reason changed, status kept", disks{"d": fullDisk(20*fixture.GiB, "21474836480"+fullMsg)},
			disks{"d": reportedDisk("uuid-1", 100*fixture.GiB, 20*fixture.GiB, false, v1beta1.DiskConditionReasonSchedOff, "scheduling is disabled on the disk")}, false},
		{"a Full message's text besides the bytes changed", disks{"d": fullDisk(20*fixture.GiB, "21474836480"+fullMsg)},
			disks{"d": fullDisk(20*fixture.GiB, "21474836480 bytes free after the 1073741824 reserved, less than 25% of 107374182400")}, false},
		{"a disk was added", disks{"a": schedulableDisk(50 * fixture.GiB)},
			disks{"a": schedulableDisk(49 * fixture.GiB), "b": schedulableDisk(10 * fixture.GiB)}, false},
		{"a disk was removed", disks{"a": schedulableDisk(50 * fixture.GiB), "b": schedulableDisk(10 * fixture.GiB)},
			disks{"a": schedulableDisk(49 * fixture.GiB)}, false},
		{"a disk was renamed", disks{"a": schedulableDisk(50 * fixture.GiB)}, disks{"b": schedulableDisk(49 * fixture.GiB)}, false},
		{"StorageMaximum changed", disks{"d": schedulableDisk(50 * fixture.GiB)},
			disks{"d": reportedDisk("uuid-1", 200*fixture.GiB, 49*fixture.GiB, true, v1beta1.DiskConditionReasonSchedulable, "disk can take new replicas")}, false},
		{"the UUID changed", disks{"d": schedulableDisk(50 * fixture.GiB)},
			disks{"d": reportedDisk("uuid-2", 100*fixture.GiB, 49*fixture.GiB, true, v1beta1.DiskConditionReasonSchedulable, "disk can take new replicas")}, false},
		{"the orphan list changed", disks{"d": schedulableDisk(50 * fixture.GiB)}, disks{"d": func() *v1beta1.DiskStatus {
			st := schedulableDisk(49 * fixture.GiB)
			st.OrphanedReplicaDirectories = []string{"vol-1-r-abc"}
			return st
		}()}, false},
		{"the scheduled replicas changed", disks{"d": schedulableDisk(50 * fixture.GiB)}, disks{"d": func() *v1beta1.DiskStatus {
			st := schedulableDisk(49 * fixture.GiB)
			st.ScheduledReplica, st.StorageScheduled = map[string]int64{"r-1": fixture.GiB}, fixture.GiB
			return st
		}()}, false},
		{"a status appeared for a known disk", disks{"d": nil}, disks{"d": schedulableDisk(50 * fixture.GiB)}, false},
		{"no status before", nil, disks{"d": schedulableDisk(50 * fixture.GiB)}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, onlyFreeSpaceMoved(tc.old, tc.fresh))
		})
	}
}

// A disk check that finds only free space moved enqueues the node once per
// free-space report interval; any other change is enqueued at once.
func TestCheckDisksPacesFreeSpaceReports(t *testing.T) {
	const interval = 5 * time.Minute
	diskDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(diskDir, types.DiskConfigFile), []byte(`{"diskUUID":"uuid-1"}`), 0o644))
	info, err := inspectDisk(diskDir, "uuid-1")
	require.NoError(t, err)
	// The Node reports the disk as it is, but with 1 GiB more free space
	// than it has: past stableAvailable's threshold (at most 256 MiB)
	// however the filesystem's use drifts during the test.
	node := fixture.Node("node-1", map[string]string{"disk-1": diskDir})
	node.Status.DiskStatus = map[string]*v1beta1.DiskStatus{"disk-1": reportedDisk("uuid-1", info.Total, info.Available+fixture.GiB,
		true, v1beta1.DiskConditionReasonSchedulable, "disk can take new replicas")}

	env := dstest.New(t, []runtime.Object{node, fixture.ZeroMinAvailable()}, nil)
	nc, err := NewNodeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", nil,
		NodeControllerOptions{FreeSpaceReportInterval: interval})
	require.NoError(t, err)
	// The informer's replay of the Node is the only add until the test's
	// own: the checks write nothing, so no further event comes.
	require.Eventually(t, func() bool { return nc.Queue.Len() == 1 }, 5*time.Second, 10*time.Millisecond)
	key, _ := nc.Queue.Get()
	nc.Queue.Done(key)
	q := &addCounter{TypedRateLimitingInterface: nc.Queue}
	nc.Queue = q

	steps := []struct {
		name    string
		advance time.Duration
		change  func(t *testing.T)
		adds    int32 // total so far
	}{
		{name: "free space moved: reported", adds: 1},
		{name: "a disk check later: held", advance: 30 * time.Second, adds: 1},
		{name: "just inside the interval: held", advance: interval - 31*time.Second, adds: 1},
		{name: "the interval has passed: reported again", advance: time.Second, adds: 2},
		{name: "a check right after: held", adds: 2},
		{
			name: "the disk goes away: reported at once, within the interval", advance: 30 * time.Second, adds: 3,
			change: func(t *testing.T) { require.NoError(t, os.RemoveAll(diskDir)) },
		},
		{name: "still gone: the verdict change is reported at every check until written", advance: 30 * time.Second, adds: 4},
	}
	for _, s := range steps {
		env.Clock.Step(s.advance)
		if s.change != nil {
			s.change(t)
		}
		nc.checkDisks(t.Context())
		assert.Equal(t, s.adds, q.adds.Load(), s.name)
	}
	key, _ = q.Get()
	assert.Equal(t, fixture.NS+"/node-1", key)
}
