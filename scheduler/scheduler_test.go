package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

const gi = int64(1) << 30

// --- helpers -----------------------------------------------------------------

func volume(name string, size int64) *v1beta1.Volume {
	return &v1beta1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1beta1.VolumeSpec{Size: *resource.NewQuantity(size, resource.BinarySI), NumberOfReplicas: 3},
	}
}

type diskDef struct {
	name string
	spec v1beta1.DiskSpec
	st   *v1beta1.DiskStatus
}

// disk is a schedulable disk of max bytes, avail of them free, scheduled of
// them promised to replicas. Its UUID is filled in by node().
func disk(name string, max, avail, scheduled int64, mods ...func(*diskDef)) diskDef {
	d := diskDef{
		name: name,
		spec: v1beta1.DiskSpec{Path: "/data/" + name, AllowScheduling: true},
		st:   &v1beta1.DiskStatus{StorageMaximum: max, StorageAvailable: avail, StorageScheduled: scheduled},
	}
	for _, m := range mods {
		m(&d)
	}
	return d
}

// bigDisk is an empty 100 GiB disk.
func bigDisk(name string, mods ...func(*diskDef)) diskDef {
	return disk(name, 100*gi, 100*gi, 0, mods...)
}

func diskSchedOff(d *diskDef) { d.spec.AllowScheduling = false }
func diskNoStatus(d *diskDef) { d.st = nil }
func diskNoUUID(d *diskDef)   { d.st.DiskUUID = "-" } // node() leaves "-" empty
func reserved(b int64) func(*diskDef) {
	return func(d *diskDef) { d.spec.StorageReserved = *resource.NewQuantity(b, resource.BinarySI) }
}
func diskCond(status metav1.ConditionStatus, msg string) func(*diskDef) {
	return func(d *diskDef) {
		d.st.Conditions = append(d.st.Conditions, metav1.Condition{
			Type: v1beta1.ConditionTypeSchedulable, Status: status, Reason: "X", Message: msg})
	}
}

func diskUUID(node, disk string) string { return "uuid-" + node + "-" + disk }

// node is a ready node that allows scheduling, with the given disks.
func node(name string, disks ...diskDef) *v1beta1.Node {
	n := &v1beta1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1beta1.NodeSpec{AllowScheduling: true, Disks: map[string]v1beta1.DiskSpec{}},
		Status: v1beta1.NodeStatus{
			Conditions: []metav1.Condition{{Type: v1beta1.ConditionTypeReady, Status: metav1.ConditionTrue, Reason: "ManagerRunning"}},
			DiskStatus: map[string]*v1beta1.DiskStatus{},
		},
	}
	for _, d := range disks {
		n.Spec.Disks[d.name] = d.spec
		if d.st != nil {
			st := d.st.DeepCopy()
			switch st.DiskUUID {
			case "":
				st.DiskUUID = diskUUID(name, d.name)
			case "-":
				st.DiskUUID = ""
			}
			n.Status.DiskStatus[d.name] = st
		}
	}
	return n
}

func notReady(n *v1beta1.Node) *v1beta1.Node {
	n.Status.Conditions[0].Status = metav1.ConditionFalse
	n.Status.Conditions[0].Reason = v1beta1.NodeConditionReasonManagerDown
	return n
}

func schedOff(n *v1beta1.Node) *v1beta1.Node {
	n.Spec.AllowScheduling = false
	return n
}

// replica of volume v1 on node/disk (disk "" = unscheduled).
func replica(name, nodeName, diskName string) *v1beta1.Replica {
	r := &v1beta1.Replica{ObjectMeta: metav1.ObjectMeta{Name: name}}
	r.Spec.VolumeName = "v1"
	r.Spec.VolumeSize = gi
	r.Spec.NodeID = nodeName
	if diskName != "" {
		r.Spec.DiskID = diskUUID(nodeName, diskName)
		r.Spec.DiskPath = "/data/" + diskName
	}
	return r
}

func failed(r *v1beta1.Replica) *v1beta1.Replica {
	r.Spec.FailedAt = "2026-01-02T03:04:05Z"
	return r
}

func opts(alive ...string) Options {
	o := Options{OverProvisioningPercentage: 100, MinimalAvailablePercentage: 25, AliveNodes: map[string]bool{}}
	for _, a := range alive {
		o.AliveNodes[a] = true
	}
	return o
}

func imDown(o Options, nodes ...string) Options {
	o.InstanceManagerDown = map[string]string{}
	for _, n := range nodes {
		o.InstanceManagerDown[n] = "instance manager im-" + n + " is error"
	}
	return o
}

func soft(o Options) Options {
	o.SoftAntiAffinity = true
	return o
}

func place(nodeName, diskName string) Placement {
	return Placement{NodeID: nodeName, DiskName: diskName, DiskUUID: diskUUID(nodeName, diskName), DiskPath: "/data/" + diskName}
}

// --- single decisions --------------------------------------------------------

func TestScheduleReplica(t *testing.T) {
	three := func() []*v1beta1.Node {
		return []*v1beta1.Node{node("n1", bigDisk("d1")), node("n2", bigDisk("d1")), node("n3", bigDisk("d1"))}
	}
	tests := []struct {
		name     string
		vol      *v1beta1.Volume
		replicas []*v1beta1.Replica
		nodes    []*v1beta1.Node
		opts     Options
		want     Placement
		wantErr  []string // substrings of a *NoPlacementError message
	}{
		{
			name:  "empty cluster of three picks the first by name",
			nodes: three(), opts: opts("n1", "n2", "n3"),
			want: place("n1", "d1"),
		},
		{
			name:     "nodes with healthy replicas are excluded",
			replicas: []*v1beta1.Replica{replica("r1", "n1", "d1"), replica("r2", "n2", "d1")},
			nodes:    three(), opts: opts("n1", "n2", "n3"),
			want: place("n3", "d1"),
		},
		{
			name:     "unscheduled replicas and replicas of other volumes are ignored",
			replicas: []*v1beta1.Replica{replica("r1", "", ""), func() *v1beta1.Replica { r := replica("x1", "n1", "d1"); r.Spec.VolumeName = "other"; return r }()},
			nodes:    three(), opts: opts("n1", "n2", "n3"),
			want: place("n1", "d1"),
		},
		{
			name:     "a failed replica's node may be used again, on another disk",
			replicas: []*v1beta1.Replica{failed(replica("r1", "n1", "d1")), replica("r2", "n2", "d1"), replica("r3", "n3", "d1")},
			nodes: []*v1beta1.Node{
				node("n1", bigDisk("d1"), bigDisk("d2")), node("n2", bigDisk("d1")), node("n3", bigDisk("d1")),
			},
			opts: opts("n1", "n2", "n3"),
			want: place("n1", "d2"),
		},
		{
			name:     "a failed replica's disk is never reused",
			replicas: []*v1beta1.Replica{failed(replica("r1", "n1", "d1")), replica("r2", "n2", "d1"), replica("r3", "n3", "d1")},
			nodes:    three(), opts: opts("n1", "n2", "n3"),
			wantErr: []string{"n1/d1: already holds replica r1", "n2: already holds replica r2", "n3: already holds replica r3"},
		},
		{
			name:  "dead node is skipped",
			nodes: three(), opts: opts("n2", "n3"),
			want: place("n2", "d1"),
		},
		{
			name:  "node whose instance manager is not running is skipped",
			nodes: three(), opts: imDown(opts("n1", "n2", "n3"), "n1"),
			want: place("n2", "d1"),
		},
		{
			name:  "no node has a running instance manager: the reason is in the message",
			nodes: three(), opts: imDown(opts("n1", "n2", "n3"), "n1", "n2", "n3"),
			wantErr: []string{"n1: instance manager im-n1 is error", "n2: instance manager im-n2 is error", "n3: instance manager im-n3 is error"},
		},
		{
			name:  "unready node is skipped",
			nodes: []*v1beta1.Node{notReady(node("n1", bigDisk("d1"))), node("n2", bigDisk("d1"))},
			opts:  opts("n1", "n2"),
			want:  place("n2", "d1"),
		},
		{
			name: "node without Ready condition is skipped",
			nodes: []*v1beta1.Node{
				func() *v1beta1.Node { n := node("n1", bigDisk("d1")); n.Status.Conditions = nil; return n }(),
				node("n2", bigDisk("d1")),
			},
			opts: opts("n1", "n2"),
			want: place("n2", "d1"),
		},
		{
			name:  "node with scheduling disabled is skipped",
			nodes: []*v1beta1.Node{schedOff(node("n1", bigDisk("d1"))), node("n2", bigDisk("d1"))},
			opts:  opts("n1", "n2"),
			want:  place("n2", "d1"),
		},
		{
			name:  "disk with scheduling disabled is skipped",
			nodes: []*v1beta1.Node{node("n1", bigDisk("d1", diskSchedOff), bigDisk("d2"))},
			opts:  opts("n1"),
			want:  place("n1", "d2"),
		},
		{
			name:  "disk without status or UUID is skipped",
			nodes: []*v1beta1.Node{node("n1", bigDisk("d1", diskNoStatus), bigDisk("d2", diskNoUUID), bigDisk("d3"))},
			opts:  opts("n1"),
			want:  place("n1", "d3"),
		},
		{
			name:  "disk whose Schedulable condition is False is skipped",
			nodes: []*v1beta1.Node{node("n1", bigDisk("d1", diskCond(metav1.ConditionFalse, "disk is full")), bigDisk("d2", diskCond(metav1.ConditionTrue, "ok")))},
			opts:  opts("n1"),
			want:  place("n1", "d2"),
		},
		{
			name:  "full disk: scheduled space leaves no room",
			nodes: []*v1beta1.Node{node("n1", disk("d1", 10*gi, 10*gi, 9*gi+1)), node("n2", disk("d1", 10*gi, 10*gi, 9*gi))},
			opts:  opts("n1", "n2"),
			want:  place("n2", "d1"),
		},
		{
			name:  "full disk: too little free space for the minimal-available percentage",
			nodes: []*v1beta1.Node{node("n1", disk("d1", 100*gi, 25*gi-1, 0)), node("n2", disk("d1", 100*gi, 25*gi, 0))},
			opts:  opts("n1", "n2"),
			want:  place("n2", "d1"),
		},
		{
			name: "the volume's actual data counts against the minimal-available percentage",
			vol:  func() *v1beta1.Volume { v := volume("v1", gi); v.Status.ActualSize = 5 * gi; return v }(),
			nodes: []*v1beta1.Node{
				node("n1", disk("d1", 100*gi, 30*gi-1, 0)), node("n2", disk("d1", 100*gi, 30*gi, 0)),
			},
			opts: opts("n1", "n2"),
			want: place("n2", "d1"),
		},
		{
			name: "reserved storage shrinks the usable space",
			nodes: []*v1beta1.Node{
				node("n1", disk("d1", 100*gi, 100*gi, 25*gi+1, reserved(74*gi))),
				node("n2", disk("d1", 100*gi, 100*gi, 25*gi, reserved(74*gi))),
			},
			opts: opts("n1", "n2"),
			want: place("n2", "d1"),
		},
		{
			name: "reserved storage also counts against the minimal-available percentage",
			nodes: []*v1beta1.Node{
				node("n1", disk("d1", 100*gi, 50*gi, 0, reserved(25*gi+1))),
				node("n2", disk("d1", 100*gi, 50*gi, 0, reserved(25*gi))),
			},
			opts: opts("n1", "n2"),
			want: place("n2", "d1"),
		},
		{
			name:    "over-provisioning 100% refuses a disk already promised beyond its size",
			nodes:   []*v1beta1.Node{node("n1", disk("d1", 10*gi, 10*gi, 15*gi))},
			opts:    opts("n1"),
			wantErr: []string{"n1/d1: needs 1073741824 bytes, 0 schedulable (100% of 10737418240 usable, 16106127360 already scheduled; storage-over-provisioning-percentage)"},
		},
		{
			name:  "over-provisioning 200% accepts it",
			nodes: []*v1beta1.Node{node("n1", disk("d1", 10*gi, 10*gi, 15*gi))},
			opts:  func() Options { o := opts("n1"); o.OverProvisioningPercentage = 200; return o }(),
			want:  place("n1", "d1"),
		},
		{
			name:    "over-provisioning 200% still has a limit",
			vol:     volume("v1", 5*gi+1),
			nodes:   []*v1beta1.Node{node("n1", disk("d1", 10*gi, 10*gi, 15*gi))},
			opts:    func() Options { o := opts("n1"); o.OverProvisioningPercentage = 200; return o }(),
			wantErr: []string{"n1/d1: needs 5368709121 bytes, 5368709120 schedulable"},
		},
		{
			name:     "soft anti-affinity off: an occupied node is refused",
			replicas: []*v1beta1.Replica{replica("r1", "n1", "d1")},
			nodes:    []*v1beta1.Node{node("n1", bigDisk("d1"), bigDisk("d2"))},
			opts:     opts("n1"),
			wantErr:  []string{"n1: already holds replica r1 (replica-soft-anti-affinity is off)"},
		},
		{
			name:     "soft anti-affinity on: an occupied node takes one on another disk",
			replicas: []*v1beta1.Replica{replica("r1", "n1", "d1")},
			nodes:    []*v1beta1.Node{node("n1", bigDisk("d1"), bigDisk("d2"))},
			opts:     soft(opts("n1")),
			want:     place("n1", "d2"),
		},
		{
			name:     "soft anti-affinity on: a free node still wins over a roomier occupied one",
			replicas: []*v1beta1.Replica{replica("r1", "n1", "d1")},
			nodes:    []*v1beta1.Node{node("n1", bigDisk("d1"), disk("d2", 1000*gi, 1000*gi, 0)), node("n2", disk("d1", 10*gi, 10*gi, 0))},
			opts:     soft(opts("n1", "n2")),
			want:     place("n2", "d1"),
		},
		{
			name:     "soft anti-affinity on: the node with fewer replicas wins",
			replicas: []*v1beta1.Replica{replica("r1", "n1", "d1"), replica("r2", "n1", "d2"), replica("r3", "n2", "d1")},
			nodes:    []*v1beta1.Node{node("n1", bigDisk("d1"), bigDisk("d2"), bigDisk("d3")), node("n2", bigDisk("d1"), bigDisk("d2"))},
			opts:     soft(opts("n1", "n2")),
			want:     place("n2", "d2"),
		},
		{
			name:     "soft anti-affinity on: the same disk is never used twice",
			replicas: []*v1beta1.Replica{replica("r1", "n1", "d1")},
			nodes:    []*v1beta1.Node{node("n1", bigDisk("d1"))},
			opts:     soft(opts("n1")),
			wantErr:  []string{"n1/d1: already holds replica r1"},
		},
		{
			name: "a replica recorded by path only still blocks its disk",
			replicas: []*v1beta1.Replica{func() *v1beta1.Replica {
				r := replica("r1", "n1", "d1")
				r.Spec.DiskID = ""
				return r
			}()},
			nodes:   []*v1beta1.Node{node("n1", bigDisk("d1"))},
			opts:    soft(opts("n1")),
			wantErr: []string{"n1/d1: already holds replica r1"},
		},
		{
			name:  "the disk with the most schedulable space left wins",
			nodes: []*v1beta1.Node{node("n1", disk("d1", 100*gi, 100*gi, 50*gi)), node("n2", disk("d1", 100*gi, 100*gi, 10*gi), disk("d2", 100*gi, 100*gi, 20*gi))},
			opts:  opts("n1", "n2"),
			want:  place("n2", "d1"),
		},
		{
			name:  "schedulable space, not free space, ranks disks",
			nodes: []*v1beta1.Node{node("n1", disk("d1", 100*gi, 90*gi, 50*gi), disk("d2", 100*gi, 30*gi, 0))},
			opts:  opts("n1"),
			want:  place("n1", "d2"),
		},
		{
			name:    "no nodes at all",
			opts:    opts(),
			wantErr: []string{"no node can take a new replica: there are no nodes"},
		},
		{
			name:    "disk of unknown size",
			nodes:   []*v1beta1.Node{node("n1", disk("d1", 0, 0, 0))},
			opts:    opts("n1"),
			wantErr: []string{"n1/d1: size unknown (storageMaximum is 0)"},
		},
		{
			name:    "node without disks",
			nodes:   []*v1beta1.Node{node("n1")},
			opts:    opts("n1"),
			wantErr: []string{"n1: has no disks"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vol := tc.vol
			if vol == nil {
				vol = volume("v1", gi)
			}
			got, err := ScheduleReplica(vol, tc.replicas, tc.nodes, tc.opts)
			if tc.wantErr != nil {
				var npe *NoPlacementError
				require.ErrorAs(t, err, &npe)
				assert.True(t, IsNoPlacement(err))
				assert.Equal(t, "v1", npe.Volume)
				for _, s := range tc.wantErr {
					assert.Contains(t, err.Error(), s)
				}
				assert.Equal(t, Placement{}, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// --- repeated decisions, as the volume controller makes them ----------------

// scheduleAll places n replicas one after another, feeding each placement back
// in as a replica, and returns the placements and the first error.
func scheduleAll(vol *v1beta1.Volume, nodes []*v1beta1.Node, o Options, n int) ([]Placement, error) {
	var replicas []*v1beta1.Replica
	var out []Placement
	for i := range n {
		p, err := ScheduleReplica(vol, replicas, nodes, o)
		if err != nil {
			return out, err
		}
		out = append(out, p)
		replicas = append(replicas, replica(fmt.Sprintf("v1-r-%d", i), p.NodeID, p.DiskName))
	}
	return out, nil
}

func TestThreeNodesGetThreeDistinctReplicas(t *testing.T) {
	nodes := []*v1beta1.Node{
		node("n1", bigDisk("d1"), bigDisk("d2")),
		node("n2", bigDisk("d1"), bigDisk("d2")),
		node("n3", bigDisk("d1"), bigDisk("d2")),
	}
	for _, o := range []Options{opts("n1", "n2", "n3"), soft(opts("n1", "n2", "n3"))} {
		got, err := scheduleAll(volume("v1", gi), nodes, o, 3)
		require.NoError(t, err, "soft=%v", o.SoftAntiAffinity)
		seen := map[string]bool{}
		for _, p := range got {
			seen[p.NodeID] = true
		}
		assert.Len(t, seen, 3, "soft=%v: %v", o.SoftAntiAffinity, got)
	}

	// A fourth replica only fits with soft anti-affinity.
	_, err := scheduleAll(volume("v1", gi), nodes, opts("n1", "n2", "n3"), 4)
	require.True(t, IsNoPlacement(err))
	got, err := scheduleAll(volume("v1", gi), nodes, soft(opts("n1", "n2", "n3")), 4)
	require.NoError(t, err)
	assert.Equal(t, "d2", got[3].DiskName)
}

func TestSoftAntiAffinityTwoNodesThreeReplicas(t *testing.T) {
	twoDisks := []*v1beta1.Node{node("n1", bigDisk("d1"), bigDisk("d2")), node("n2", bigDisk("d1"), bigDisk("d2"))}

	t.Run("off", func(t *testing.T) {
		got, err := scheduleAll(volume("v1", gi), twoDisks, opts("n1", "n2"), 3)
		require.Len(t, got, 2)
		assert.NotEqual(t, got[0].NodeID, got[1].NodeID)
		var npe *NoPlacementError
		require.ErrorAs(t, err, &npe)
		assert.Equal(t, "no node can take a new replica: "+
			"n1: already holds replica v1-r-0 (replica-soft-anti-affinity is off); "+
			"n2: already holds replica v1-r-1 (replica-soft-anti-affinity is off)", err.Error())
	})

	t.Run("on", func(t *testing.T) {
		got, err := scheduleAll(volume("v1", gi), twoDisks, soft(opts("n1", "n2")), 3)
		require.NoError(t, err)
		assert.NotEqual(t, got[0].NodeID, got[1].NodeID, "the first two go to distinct nodes")
		disks := map[string]bool{}
		for _, p := range got {
			assert.False(t, disks[p.DiskUUID], "disk %s used twice", p.DiskUUID)
			disks[p.DiskUUID] = true
		}
	})

	t.Run("on, one disk per node", func(t *testing.T) {
		oneDisk := []*v1beta1.Node{node("n1", bigDisk("d1")), node("n2", bigDisk("d1"))}
		got, err := scheduleAll(volume("v1", gi), oneDisk, soft(opts("n1", "n2")), 3)
		assert.Len(t, got, 2)
		require.True(t, IsNoPlacement(err))
		assert.Contains(t, err.Error(), "n1/d1: already holds replica v1-r-0")
		assert.Contains(t, err.Error(), "n2/d1: already holds replica v1-r-1")
	})
}

func TestDeterministic(t *testing.T) {
	mk := func() []*v1beta1.Node {
		return []*v1beta1.Node{
			node("n3", bigDisk("b"), bigDisk("a")),
			node("n1", bigDisk("b"), bigDisk("a")),
			node("n2", bigDisk("b"), bigDisk("a")),
		}
	}
	o := opts("n1", "n2", "n3")
	want, err := ScheduleReplica(volume("v1", gi), nil, mk(), o)
	require.NoError(t, err)
	assert.Equal(t, place("n1", "a"), want)

	// Every input order gives the same answer, every time.
	perms := [][]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	for _, perm := range perms {
		base := mk()
		nodes := []*v1beta1.Node{base[perm[0]], base[perm[1]], base[perm[2]]}
		for range 5 {
			got, err := ScheduleReplica(volume("v1", gi), nil, nodes, o)
			require.NoError(t, err)
			assert.Equal(t, want, got, "order %v", perm)
		}
	}

	// Same for the error message.
	msg := ""
	for _, perm := range perms {
		base := mk()
		nodes := []*v1beta1.Node{base[perm[0]], base[perm[1]], base[perm[2]]}
		_, err := ScheduleReplica(volume("v1", gi), nil, nodes, opts())
		require.Error(t, err)
		if msg == "" {
			msg = err.Error()
		}
		assert.Equal(t, msg, err.Error())
	}
}

func TestErrorMessage(t *testing.T) {
	vol := volume("v1", gi)
	replicas := []*v1beta1.Replica{replica("v1-r-ab12", "node-2", "disk-1")}
	nodes := []*v1beta1.Node{
		node("node-1", disk("disk-1", 2*gi, 2*gi, 2*gi-50<<20), bigDisk("disk-2", diskSchedOff)),
		node("node-2", bigDisk("disk-1")),
		notReady(node("node-3", bigDisk("disk-1"))),
		node("node-4", bigDisk("disk-1")),
		schedOff(node("node-5", bigDisk("disk-1"))),
		node("node-6", bigDisk("disk-1", diskCond(metav1.ConditionFalse, "disk is not ready"))),
	}
	o := opts("node-1", "node-2", "node-3", "node-5", "node-6")

	_, err := ScheduleReplica(vol, replicas, nodes, o)
	var npe *NoPlacementError
	require.True(t, errors.As(err, &npe))
	want := []string{
		"node-1/disk-1: needs 1073741824 bytes, 52428800 schedulable (100% of 2147483648 usable, 2095054848 already scheduled; storage-over-provisioning-percentage)",
		"node-1/disk-2: scheduling is disabled on the disk",
		"node-2: already holds replica v1-r-ab12 (replica-soft-anti-affinity is off)",
		"node-3: not ready (ManagerDown)",
		"node-4: down (its manager holds no heartbeat)",
		"node-5: scheduling is disabled on the node",
		"node-6/disk-1: not schedulable: disk is not ready",
	}
	assert.Equal(t, "no node can take a new replica: "+strings.Join(want, "; "), err.Error())
	require.Len(t, npe.Rejections, len(want))
	assert.Equal(t, Rejection{Node: "node-2", Reason: "already holds replica v1-r-ab12 (replica-soft-anti-affinity is off)"}, npe.Rejections[2])

	// Wrapped, it is still recognised.
	assert.True(t, IsNoPlacement(fmt.Errorf("volume v1: %w", err)))
	assert.False(t, IsNoPlacement(errors.New("other")))

	// Minimal-available rejection names its setting.
	_, err = ScheduleReplica(vol, nil, []*v1beta1.Node{node("n1", disk("d1", 100*gi, 20*gi, 0, reserved(gi)))}, opts("n1"))
	require.Error(t, err)
	assert.Equal(t, "no node can take a new replica: n1/d1: 20401094656 bytes free after 1073741824 reserved and 0 of data, "+
		"below 25% of 107374182400 (storage-minimal-available-percentage)", err.Error())
}

func TestInvalidInput(t *testing.T) {
	_, err := ScheduleReplica(nil, nil, nil, opts())
	require.Error(t, err)
	assert.False(t, IsNoPlacement(err))

	_, err = ScheduleReplica(volume("v1", 0), nil, []*v1beta1.Node{node("n1", bigDisk("d1"))}, opts("n1"))
	require.Error(t, err)
	assert.False(t, IsNoPlacement(err))

	// nil entries are skipped.
	got, err := ScheduleReplica(volume("v1", gi), []*v1beta1.Replica{nil}, []*v1beta1.Node{nil, node("n1", bigDisk("d1"))}, opts("n1"))
	require.NoError(t, err)
	assert.Equal(t, place("n1", "d1"), got)
}

func TestPercent(t *testing.T) {
	for _, tc := range []struct{ v, pct, floor, ceil int64 }{
		{0, 100, 0, 0},
		{-5, 100, 0, 0},
		{100, 0, 0, 0},
		{1000, 25, 250, 250},
		{1001, 25, 250, 251},
		{7, 150, 10, 11},
		{1 << 62, 100, 1 << 62, 1 << 62},
		{1 << 59, 1000, (1 << 59) * 10, (1 << 59) * 10},
	} {
		assert.Equal(t, tc.floor, percentFloor(tc.v, tc.pct), "floor(%d*%d%%)", tc.v, tc.pct)
		assert.Equal(t, tc.ceil, percentCeil(tc.v, tc.pct), "ceil(%d*%d%%)", tc.v, tc.pct)
	}
}

// Replicas placed since the disks last reported count through
// ScheduledBytes, so a burst of new volumes spreads over equal nodes.
func TestScheduledBytesSpreadsABurst(t *testing.T) {
	const gib = int64(1) << 30
	nodes := []*v1beta1.Node{node("node-1", disk("disk-1", 100*gib, 100*gib, 0)), node("node-2", disk("disk-1", 100*gib, 100*gib, 0))}
	o := opts("node-1", "node-2")
	p, err := ScheduleReplica(volume("v1", gib), nil, nodes, o)
	require.NoError(t, err)
	assert.Equal(t, "node-1", p.NodeID, "a tie goes by name")
	o.ScheduledBytes = map[string]int64{diskUUID("node-1", "disk-1"): gib}
	p, err = ScheduleReplica(volume("v2", gib), nil, nodes, o)
	require.NoError(t, err)
	assert.Equal(t, "node-2", p.NodeID, "node-1's disk already took a replica its status does not show yet")
}
