package deployed

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// writeAroundTwoSnapshots has the Pod write its block claim at known
// offsets around two snapshots, which snapshot takes: blocksOfTheFirst
// before the first, blocksBetween before the second (one of them a
// rewrite), and 4 KiB at 12 MiB after it, which only the head holds.
func writeAroundTwoSnapshots(t *testing.T, podName string, snapshot func(name string), first, second string) {
	t.Helper()
	write := func(seekKiB, kib int) {
		exec1(t, podName, "dd if=/dev/urandom of="+blockDevice+" bs=4k seek="+strconv.Itoa(seekKiB/4)+
			" count="+strconv.Itoa(kib/4)+" oflag=direct conv=fsync,notrunc 2>/dev/null; echo done")
	}
	write(0, 1024)   // 1 MiB at 0
	write(5*1024, 4) // 4 KiB at 5 MiB
	snapshot(first)
	write(5*1024, 4)  // rewritten
	write(9*1024, 64) // 64 KiB at 9 MiB
	snapshot(second)
	write(12*1024, 4) // the head only
}

// The extents writeAroundTwoSnapshots writes: the first snapshot's, and
// those written between the two.
var (
	blocksOfTheFirst = [][2]int64{{0, 1 << 20}, {5 << 20, 4096}}
	blocksBetween    = [][2]int64{{5 << 20, 4096}, {9 << 20, 64 << 10}}
)

// Changed-block tracking through the REST API: a Pod writes a block claim
// at known offsets around two snapshots. The allocated answer of the
// first and the delta between them list exactly those blocks (a rewritten
// block counts as changed, the head's writes never show); one extent per
// page pages on with next. Asked again once the Pod is gone, the volume is
// attached for the call and given back, and the delta is the same.
func testRESTSnapshotBlocks(t *testing.T) {
	logsOnFailure(t)
	admin := newRESTClient(t, "127.0.0.1", serviceAccountToken(t, "rest-blocks-admin", "cluster-admin", ""))
	claimIn(t, podNamespace, "cbt", "16Mi", "volumeMode: Block")
	podIn(t, podNamespace, "cbt-1", "127.0.0.2", "cbt", "exec sleep 3600", true)
	volume := volumeOfClaim(t, "cbt")
	writeAroundTwoSnapshots(t, "cbt-1", func(name string) { restSnapshot(t, admin, volume, name) }, "cbt-s1", "cbt-s2")

	const mib = 1 << 20
	extents := func(body map[string]any) [][2]int64 {
		var out [][2]int64
		for _, e := range body["extents"].([]any) {
			m := e.(map[string]any)
			out = append(out, [2]int64{int64(m["offset"].(float64)), int64(m["length"].(float64))})
		}
		return out
	}
	ask := func(req map[string]any) map[string]any {
		code, body := admin.do("POST", "/v1/volumes/"+volume+"?action=snapshotBlocks", req)
		require.Equal(t, http.StatusOK, code, "%v", body)
		assert.EqualValues(t, 16*mib, body["volumeSize"])
		assert.EqualValues(t, 4096, body["blockSize"])
		return body
	}
	check := func(how string) { // while the Pod holds the volume
		assert.Equal(t, blocksOfTheFirst, extents(ask(map[string]any{"snapshot": "cbt-s1"})), "%s: the blocks of cbt-s1", how)
		assert.Equal(t, blocksBetween, extents(ask(map[string]any{"snapshot": "cbt-s2", "base": "cbt-s1"})),
			"%s: written between cbt-s1 and cbt-s2", how)
		page := ask(map[string]any{"snapshot": "cbt-s2", "base": "cbt-s1", "maxResults": 1})
		assert.Equal(t, [][2]int64{{5 * mib, 4096}}, extents(page), "%s: the first page", how)
		require.EqualValues(t, 5*mib+4096, page["next"], "%s: the next page's start", how)
		page = ask(map[string]any{"snapshot": "cbt-s2", "base": "cbt-s1", "maxResults": 1, "startingOffset": page["next"]})
		assert.Equal(t, [][2]int64{{9 * mib, 64 << 10}}, extents(page), "%s: the last page", how)
		assert.Nil(t, page["next"], "%s: nothing follows", how)
	}
	check("attached to the Pod")
	code, body := admin.do("POST", "/v1/volumes/"+volume+"?action=snapshotBlocks", map[string]any{"snapshot": "cbt-s1", "base": "cbt-s2"})
	assert.Equal(t, http.StatusBadRequest, code, "a base newer than the snapshot: %v", body)

	kubectl(t, "-n", podNamespace, "delete", "pod", "cbt-1", "--grace-period=1")
	require.Eventually(t, func() bool {
		return getVolume(t, volume).Status.State == v1beta1.VolumeStateDetached
	}, 2*time.Minute, 250*time.Millisecond, "the volume is detached")
	start := time.Now()
	assert.Equal(t, blocksBetween, extents(ask(map[string]any{"snapshot": "cbt-s2", "base": "cbt-s1"})),
		"detached: written between cbt-s1 and cbt-s2")
	t.Logf("the delta of a detached volume (attach without frontend, answer, detach) took %s", time.Since(start).Round(time.Millisecond))
	require.Eventually(t, func() bool {
		va, err := env.strata.StrataV1beta1().VolumeAttachments(ns).Get(context.Background(), volume, metav1.GetOptions{})
		return err == nil && len(va.Spec.AttachmentTickets) == 0
	}, time.Minute, 250*time.Millisecond, "the call's tickets are given back")
}
