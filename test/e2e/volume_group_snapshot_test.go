package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

var gvrVolumeGroupSnapshot = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1",
	Resource: "volumegroupsnapshots"}

// restoreBatch is how many snapshot pairs one reader Pod mounts at once.
const restoreBatch = 5

// A Pod writes a sequence to two claims, B never ahead of A. Group
// snapshots of the two claims through VolumeGroupSnapshots of the default
// class, each restored to new claims, hold that in every cut; VolumeSnapshots
// of A then B, taken the way a tool without groups would, break it. The
// group's members carry its label, and deleting it deletes them.
//
// The long tier's proof: 10 group cuts and 3 per-volume pairs (make
// test-long). make test's smoke of the same flow is test/deployed's
// TestUserFlows/GroupSnapshotHoldsWhatThePodJustWrote (a VolumeGroupSnapshot
// of two claims a Pod has just written, each member restored).
func TestLongVolumeGroupSnapshotIsCrashConsistentThroughPods(t *testing.T) {
	groupCutsHoldTheInvariant(t, "vgs", 10, 3)
}

// The proof at full size: 100 group snapshots and 10 per-volume
// pairs, each restored and checked. It takes about 30 minutes here, more
// than CI's budget leaves, so it is neither make test's nor make
// test-long's: make test-proof runs it (last run: docs/testing.md).
func TestProofVolumeGroupSnapshotsHundredCuts(t *testing.T) {
	groupCutsHoldTheInvariant(t, "vgsl", 100, 10)
}

// snapshotPair is what one cut left of A and B: two VolumeSnapshots.
type snapshotPair struct {
	name string // the cut, for messages
	a, b string // VolumeSnapshot names
}

func groupCutsHoldTheInvariant(t *testing.T, prefix string, cuts, perVolume int) {
	a, b := createPVC(t, prefix+"-a", "64Mi"), createPVC(t, prefix+"-b", "64Mi")
	volA, volB := boundVolume(t, a), boundVolume(t, b)
	kubectl(t, "-n", podNamespace, "label", "pvc", a.Name, b.Name, "e2e-group="+prefix)
	writer := prefix + "-writer"
	createPod(t, podWithClaims(writer, "127.0.0.2", seqWriterScript, a.Name, b.Name))
	waitPodRunning(t, writer)
	require.Eventually(t, func() bool { return readSeqs(t, writer, 2)[1] > 20 }, time.Minute, 200*time.Millisecond, "the writer runs")

	var grouped []snapshotPair
	started := time.Now()
	for i := range cuts {
		name := fmt.Sprintf("%s-cut%d", prefix, i)
		grouped = append(grouped, createVolumeGroupSnapshot(t, name, prefix, a.Name, b.Name))
	}
	t.Logf("%d VolumeGroupSnapshots ready in %s", cuts, time.Since(started).Round(time.Millisecond))
	logGroupStalls(t, volA, volB)

	// The members are Strata snapshots of one SnapshotGroup: its label
	// lists them.
	group := groupOfMember(t, grouped[0].a)
	out := kubectl(t, "-n", types.DefaultNamespace, "get", "snap", "-l", types.LabelSnapshotGroup+"="+group, "-o", "name")
	assert.Len(t, strings.Fields(out), 2, "kubectl get snap -l %s=%s lists both members", types.LabelSnapshotGroup, group)

	var single []snapshotPair
	for i := range perVolume {
		name := fmt.Sprintf("%s-single%d", prefix, i)
		single = append(single, snapshotPair{name: name, a: name + "-a", b: name + "-b"})
		// One after the other, as a tool without groups takes them.
		for _, s := range []struct{ snap, claim string }{{name + "-a", a.Name}, {name + "-b", b.Name}} {
			kubectlApply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec: {source: {persistentVolumeClaimName: %s}}`, s.snap, podNamespace, s.claim))
			waitVolumeSnapshotReady(t, s.snap, 2*time.Minute)
		}
		t.Cleanup(func() {
			_, _ = tryKubectl(t, "-n", podNamespace, "delete", "volumesnapshot", name+"-a", name+"-b", "--ignore-not-found")
		})
	}

	seqs := restorePairs(t, prefix, append(slices.Clone(grouped), single...))
	for _, p := range grouped {
		s := seqs[p.name]
		assert.Contains(t, []int{s[1], s[1] + 1}, s[0], "group cut %s: B never ahead of A, A at most one ahead (A %d, B %d)", p.name, s[0], s[1])
		assert.Positive(t, s[1], "cut %s holds writes", p.name)
	}
	violations := 0
	for _, p := range single {
		if s := seqs[p.name]; s[0] != s[1] && s[0] != s[1]+1 {
			violations++
		}
	}
	t.Logf("invariant held in %d of %d group cuts; per-volume snapshots broke it in %d of %d", cuts, cuts, violations, perVolume)
	assert.Positive(t, violations, "per-volume snapshots taken one after the other break the invariant at least once (the check can fail)")

	kubectl(t, "-n", podNamespace, "delete", "volumegroupsnapshot", grouped[0].name, "--wait=true", "--timeout=90s")
	require.Eventually(t, func() bool {
		out, err := tryKubectl(t, "-n", types.DefaultNamespace, "get", "snap,snapgroup", "-l", types.LabelSnapshotGroup+"="+group, "-o", "name")
		_, gerr := env.adminStrata.StrataV1beta1().SnapshotGroups(types.DefaultNamespace).Get(context.Background(), group, metav1.GetOptions{})
		return err == nil && strings.TrimSpace(out) == "" && gerr != nil
	}, 2*time.Minute, 500*time.Millisecond, "the SnapshotGroup and its members go with the VolumeGroupSnapshot")
}

// createVolumeGroupSnapshot takes a VolumeGroupSnapshot of the claims
// labelled e2e-group=label and waits until it and its member
// VolumeSnapshots are ready; it returns the members of claims a and b.
func createVolumeGroupSnapshot(t *testing.T, name, label, claimA, claimB string) snapshotPair {
	t.Helper()
	kubectlApply(t, fmt.Sprintf(`apiVersion: groupsnapshot.storage.k8s.io/v1
kind: VolumeGroupSnapshot
metadata: {name: %s, namespace: %s}
spec: {source: {selector: {matchLabels: {e2e-group: %s}}}}`, name, podNamespace, label))
	t.Cleanup(func() {
		_, _ = tryKubectl(t, "-n", podNamespace, "delete", "volumegroupsnapshot", name, "--ignore-not-found")
	})
	ctx := context.Background()
	pair := snapshotPair{name: name}
	var last string
	require.Eventually(t, func() bool {
		g, err := dynClient().Resource(gvrVolumeGroupSnapshot).Namespace(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false
		}
		status, _, _ := unstructured.NestedMap(g.Object, "status")
		last = fmt.Sprint(status)
		if ready, _, _ := unstructured.NestedBool(g.Object, "status", "readyToUse"); !ready {
			return false
		}
		members, err := dynClient().Resource(gvrVolumeSnapshot).Namespace(podNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		pair.a, pair.b = "", ""
		for _, m := range members.Items {
			if len(m.GetOwnerReferences()) == 0 || m.GetOwnerReferences()[0].UID != g.GetUID() {
				continue
			}
			if ready, _, _ := unstructured.NestedBool(m.Object, "status", "readyToUse"); !ready {
				return false
			}
			switch claim, _, _ := unstructured.NestedString(m.Object, "spec", "source", "persistentVolumeClaimName"); claim {
			case claimA:
				pair.a = m.GetName()
			case claimB:
				pair.b = m.GetName()
			}
		}
		return pair.a != "" && pair.b != ""
	}, 2*time.Minute, 200*time.Millisecond, "VolumeGroupSnapshot %s and its members ready", name)
	t.Logf("VolumeGroupSnapshot %s: %s", name, last)
	return pair
}

// groupOfMember is the SnapshotGroup a member VolumeSnapshot's Strata
// snapshot belongs to.
func groupOfMember(t *testing.T, volumeSnapshot string) string {
	t.Helper()
	ctx := context.Background()
	vs, err := dynClient().Resource(gvrVolumeSnapshot).Namespace(podNamespace).Get(ctx, volumeSnapshot, metav1.GetOptions{})
	require.NoError(t, err)
	content, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
	out := kubectl(t, "get", "volumesnapshotcontent", content, "-o", "jsonpath={.status.snapshotHandle}")
	snap, err := env.adminStrata.StrataV1beta1().Snapshots(types.DefaultNamespace).Get(ctx, strings.TrimSpace(out), metav1.GetOptions{})
	require.NoError(t, err)
	group := snap.Labels[types.LabelSnapshotGroup]
	require.NotEmpty(t, group, "snapshot %s carries its group's label", snap.Name)
	return group
}

// logGroupStalls logs how long writes waited in the groups' cuts of the
// two volumes.
func logGroupStalls(t *testing.T, volumes ...string) {
	t.Helper()
	groups, err := env.adminStrata.StrataV1beta1().SnapshotGroups(types.DefaultNamespace).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	volumes = slices.Sorted(slices.Values(volumes))
	var stalls []int
	for _, g := range groups.Items {
		members := slices.Sorted(slices.Values(g.Spec.Volumes))
		if g.Status.State == v1beta1.SnapshotGroupReady && slices.Equal(members, volumes) {
			stalls = append(stalls, int(g.Status.StallMilliseconds))
		}
	}
	require.NotEmpty(t, stalls)
	slices.Sort(stalls)
	t.Logf("writes held during %d group cuts: p50 %d ms, p99 %d ms, max %d ms", len(stalls),
		stalls[len(stalls)/2], stalls[(len(stalls)*99)/100], stalls[len(stalls)-1])
}

// restorePairs restores every pair to two new claims, a reader Pod
// mounting a batch of them at a time, and returns each pair's A and B.
func restorePairs(t *testing.T, prefix string, pairs []snapshotPair) map[string][2]int {
	t.Helper()
	seqs := map[string][2]int{}
	for start := 0; start < len(pairs); start += restoreBatch {
		batch := pairs[start:min(start+restoreBatch, len(pairs))]
		var claims []string
		for i, p := range batch {
			for j, snap := range []string{p.a, p.b} {
				claim := fmt.Sprintf("%s-r%d-%d", prefix, start+i, j)
				createPVCFrom(t, claim, "64Mi", "snapshot.storage.k8s.io", "VolumeSnapshot", snap)
				claims = append(claims, claim)
			}
		}
		reader := fmt.Sprintf("%s-reader%d", prefix, start/restoreBatch)
		createPod(t, podWithClaims(reader, "127.0.0.3", "sleep 3600", claims...))
		waitPodRunning(t, reader)
		got := readSeqs(t, reader, len(claims))
		for i, p := range batch {
			seqs[p.name] = [2]int{got[2*i], got[2*i+1]}
			t.Logf("%s restored: A at %d, B at %d", p.name, got[2*i], got[2*i+1])
		}
		deletePod(t, reader)
		kubectl(t, append([]string{"-n", podNamespace, "delete", "pvc", "--wait=false"}, claims...)...)
	}
	return seqs
}

// readSeqs reads seq from the Pod's first n claims (/a, /b, ...) in one
// exec.
func readSeqs(t *testing.T, pod string, n int) []int {
	t.Helper()
	var dirs []string
	for i := range n {
		dirs = append(dirs, "/"+string(rune('a'+i))+"/seq")
	}
	out := kubectl(t, append([]string{"-n", podNamespace, "exec", pod, "--", "sh", "-c", `for f in "$@"; do cat "$f"; echo; done`, "sh"}, dirs...)...)
	fields := strings.Fields(out)
	require.Len(t, fields, n, "seq files of %s: %q", pod, out)
	seqs := make([]int, n)
	for i, f := range fields {
		var err error
		seqs[i], err = strconv.Atoi(f)
		require.NoError(t, err, "seq %q", f)
	}
	return seqs
}
