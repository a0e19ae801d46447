package benchscale

// What the quiet window's Node writes are: the managers report a disk's free
// space when it moves (at most one free-space-only write per node per
// --free-space-report-interval), and the bench's disks are directories on
// this machine's filesystem, shared with etcd and every log. The bench shows
// that filesystem's fill around the window and the cause of each Node write.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	nodectl "github.com/strata-storage/strata/controller/node"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The causes of a Node write, from what changed against its previous version.
const (
	causeFreeSpace  = "free space" // diskStatus[*].storageAvailable and the bytes of a DiskFull message only
	causeConditions = "conditions" // a node or disk condition (and perhaps free space)
	causeOther      = "other"      // anything else, or nothing visible
)

var nodeWriteCauses = []string{causeFreeSpace, causeConditions, causeOther}

// nodeWrite is one MODIFIED event of a Node: its cause and the disks whose
// free space moved, by how many MiB.
type nodeWrite struct {
	node, cause string
	disks       []string
	deltaMiB    []float64
	fields      []string // the JSON fields that changed, so "other" says what
}

// classifyNodeWrite compares a Node with its previous version.
func classifyNodeWrite(old, cur *v1beta1.Node) nodeWrite {
	w := nodeWrite{node: cur.Name, cause: nodeWriteCause(old, cur), fields: changedFields(old, cur)}
	for _, name := range slices.Sorted(maps.Keys(cur.Status.DiskStatus)) {
		o, n := old.Status.DiskStatus[name], cur.Status.DiskStatus[name]
		if o != nil && n != nil && o.StorageAvailable != n.StorageAvailable {
			w.disks = append(w.disks, name)
			w.deltaMiB = append(w.deltaMiB, float64(n.StorageAvailable-o.StorageAvailable)/(1<<20))
		}
	}
	return w
}

// changedFields lists the top-level metadata, spec and status fields (and
// each disk's status fields) that differ between two versions of a Node.
func changedFields(old, cur *v1beta1.Node) []string {
	var out []string
	diff := func(prefix string, a, b any) {
		am, bm := asMap(a), asMap(b)
		keys := maps.Clone(am)
		maps.Copy(keys, bm)
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			if k == "resourceVersion" || k == "managedFields" || k == "diskStatus" {
				continue
			}
			if !equality.Semantic.DeepEqual(am[k], bm[k]) {
				out = append(out, prefix+k)
			}
		}
	}
	diff("metadata.", old.ObjectMeta, cur.ObjectMeta)
	diff("spec.", old.Spec, cur.Spec)
	diff("status.", old.Status, cur.Status)
	for _, d := range slices.Sorted(maps.Keys(cur.Status.DiskStatus)) {
		diff("status.diskStatus["+d+"].", old.Status.DiskStatus[d], cur.Status.DiskStatus[d])
	}
	return out
}

func asMap(v any) map[string]any {
	m := map[string]any{}
	if raw, err := json.Marshal(v); err == nil {
		_ = json.Unmarshal(raw, &m)
	}
	return m
}

func nodeWriteCause(old, cur *v1beta1.Node) string {
	a, b := old.DeepCopy(), cur.DeepCopy()
	for _, n := range []*v1beta1.Node{a, b} {
		n.ResourceVersion, n.ManagedFields = "", nil // every write changes these
	}
	if equality.Semantic.DeepEqual(a, b) {
		return causeOther
	}
	for _, n := range []*v1beta1.Node{a, b} {
		for name, st := range n.Status.DiskStatus {
			if st != nil {
				n.Status.DiskStatus[name] = nodectl.DiskStatusWithoutFreeSpace(st)
			}
		}
	}
	if equality.Semantic.DeepEqual(a, b) {
		return causeFreeSpace
	}
	for _, n := range []*v1beta1.Node{a, b} {
		n.Status.Conditions = nil
		for _, st := range n.Status.DiskStatus {
			if st != nil {
				st.Conditions = nil
			}
		}
	}
	if equality.Semantic.DeepEqual(a, b) {
		return causeConditions
	}
	return causeOther
}

// nodeWatch records the Node writes of a window.
type nodeWatch struct {
	stop   func()
	done   chan struct{}
	mu     sync.Mutex
	writes []nodeWrite
	ended  bool // the watch closed before the window did
}

// watchNodes lists the Nodes, then logs and records every write from there
// until stop.
func (b *bench) watchNodes(ctx context.Context) (*nodeWatch, error) {
	nodes := b.strata.StrataV1beta1().Nodes(ns)
	list, err := nodes.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	prev := map[string]*v1beta1.Node{}
	for i := range list.Items {
		prev[list.Items[i].Name] = &list.Items[i]
	}
	ctx, cancel := context.WithCancel(ctx)
	wi, err := nodes.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		cancel()
		return nil, err
	}
	nw := &nodeWatch{stop: func() { cancel(); wi.Stop() }, done: make(chan struct{})}
	go func() {
		defer close(nw.done)
		for ev := range wi.ResultChan() {
			n, ok := ev.Object.(*v1beta1.Node)
			if !ok {
				continue // a watch error (Status); the count against the API server's shows it
			}
			w := nodeWrite{node: n.Name, cause: causeOther}
			if old := prev[n.Name]; ev.Type == watch.Modified && old != nil {
				w = classifyNodeWrite(old, n)
			}
			prev[n.Name] = n
			var deltas []string
			for _, d := range w.deltaMiB {
				deltas = append(deltas, fmt.Sprintf("%+.0f", d))
			}
			b.log.WithFields(logrus.Fields{"node": w.node, "event": ev.Type, "cause": w.cause,
				"disk": strings.Join(w.disks, ","), "freeDeltaMiB": strings.Join(deltas, ","),
				"changed": strings.Join(w.fields, ",")}).Info("quiet window: Node write")
			nw.mu.Lock()
			nw.writes = append(nw.writes, w)
			nw.mu.Unlock()
		}
		nw.mu.Lock()
		nw.ended = ctx.Err() == nil
		nw.mu.Unlock()
	}()
	return nw, nil
}

// finish ends the watch and returns the writes it saw, and whether it
// ended early (the writes after that are not in it).
func (nw *nodeWatch) finish() ([]nodeWrite, bool) {
	nw.stop()
	<-nw.done
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.writes, nw.ended
}

// reportNodeWrites is the quiet window's line for Node writes: counted by the
// API server, explained by the watch. A free-space-only write is within the
// rule while no node has more than allowed of them; any other is a miss, as
// is a write the watch did not see (a no-op or failed update).
func (b *bench) reportNodeWrites(window string, counted float64, writes []nodeWrite, ended bool, allowed int) {
	byCause, perNodeFree := map[string]float64{}, map[string]int{}
	for _, w := range writes {
		byCause[w.cause]++
		if w.cause == causeFreeSpace {
			perNodeFree[w.node]++
		}
	}
	b.log.WithFields(logrus.Fields{"freeSpace": byCause[causeFreeSpace], "conditions": byCause[causeConditions],
		"other": byCause[causeOther], "countedByAPIServer": counted}).Infof("quiet window: %d Node writes seen", len(writes))
	var parts []string
	for _, c := range nodeWriteCauses {
		parts = append(parts, fmt.Sprintf("%s %g", c, byCause[c]))
	}
	unseen := counted - float64(len(writes))
	if unseen > 0 {
		parts = append(parts, fmt.Sprintf("unseen %g", unseen))
	}
	if ended {
		parts = append(parts, "watch ended early")
	}
	ok := byCause[causeConditions] == 0 && byCause[causeOther] == 0 && unseen <= 0 && !ended
	for _, n := range perNodeFree {
		ok = ok && n <= allowed
	}
	b.check("API writes, strata.io Nodes, in "+window, fmt.Sprintf("%g (%s)", counted, strings.Join(parts, ", ")),
		fmt.Sprintf("free space ≤ %d/node, else 0", allowed), ok)
	b.info("  … rule", fmt.Sprintf("at most one free-space-only Node write per node per %s (managers' --free-space-report-interval)",
		nodectl.DefaultFreeSpaceReportInterval))
}

// diskFill is the fill of one filesystem that holds node disks, as df
// computes it: used / (used + available to unprivileged users).
type diskFill struct {
	nodes   []string
	usedPct float64
	free    int64 // bytes available, what the managers report as free
}

func (f diskFill) String() string {
	return fmt.Sprintf("%.1f%% used, %.2f GiB free", f.usedPct, float64(f.free)/(1<<30))
}

// diskFills statfs's every manager's disk, one entry per filesystem (on the
// local cluster all disks share one).
func (b *bench) diskFills() []diskFill {
	var out []diskFill
	byFS := map[unix.Fsid]int{}
	for _, m := range b.managers() {
		var st unix.Statfs_t
		if err := unix.Statfs(m.DiskDir, &st); err != nil {
			b.log.WithError(err).WithField("disk", m.DiskDir).Warn("statfs of a node disk")
			continue
		}
		if i, ok := byFS[st.Fsid]; ok {
			out[i].nodes = append(out[i].nodes, m.Node)
			continue
		}
		used := float64(st.Blocks-st.Bfree) * float64(st.Bsize)
		avail := float64(st.Bavail) * float64(st.Bsize)
		f := diskFill{nodes: []string{m.Node}, free: int64(st.Bavail) * st.Bsize}
		if used+avail > 0 {
			f.usedPct = 100 * used / (used + avail)
		}
		byFS[st.Fsid] = len(out)
		out = append(out, f)
	}
	return out
}

// logDiskFills logs the disks' filesystems' fill, when being before or after.
func (b *bench) logDiskFills(when string, fills []diskFill) {
	for _, f := range fills {
		b.log.WithFields(logrus.Fields{"when": when, "nodes": strings.Join(f.nodes, ","),
			"usedPct": fmt.Sprintf("%.1f", f.usedPct), "freeGiB": fmt.Sprintf("%.2f", float64(f.free)/(1<<30))}).
			Info("quiet window: fill of the disks' filesystem")
	}
}

// reportDiskFills puts the fill before → after in the table, with the move
// of its free space: the Node writes follow it.
func (b *bench) reportDiskFills(before, after []diskFill) {
	for _, f := range after {
		key := strings.Join(f.nodes, ",")
		i := slices.IndexFunc(before, func(g diskFill) bool { return strings.Join(g.nodes, ",") == key })
		if i < 0 {
			continue
		}
		b.info("disks' filesystem ("+key+"), before → after the window",
			fmt.Sprintf("%s → %s (free %+.0f MiB)", before[i], f, float64(f.free-before[i].free)/(1<<20)))
	}
}

// freeSpaceAllowance is how many free-space-only writes the rule lets one
// node make in a window: one per interval, and one more for a window that
// starts just before a report is due.
func freeSpaceAllowance(window time.Duration) int {
	return int(window/nodectl.DefaultFreeSpaceReportInterval) + 1
}
