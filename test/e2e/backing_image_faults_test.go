package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Sources that cannot give the image fail the copy with a message that
// says why. A source that may give it later is tried again with back-off
// (attempts grow); one whose bytes are wrong (a checksum mismatch) is not
// (TestBackingImageChecksumFailureBlocksVolume proves it stays so).
func TestBackingImageBadSources(t *testing.T) {
	srv := startImageServer(t)
	_, sum := rawTestImage(t, srv.dir, "good.raw", 4<<20)
	wrong := strings.Repeat("ab", 64)
	tests := []struct {
		name, url, checksum string
		want                []string
		retried             bool
	}{
		{name: "wrong checksum", url: srv.url + "/good.raw", checksum: wrong,
			want: []string{"checksum mismatch", wrong, sum, "not retried until the image's spec changes"}},
		{name: "unreachable URL", url: "http://127.0.0.1:1/image.raw",
			want: []string{"downloading", "connection refused"}, retried: true},
		{name: "not an image", url: srv.url + "/notes.txt",
			want: []string{"downloading", "HTML page, not an image"}, retried: true},
	}
	require.NoError(t, os.WriteFile(filepath.Join(srv.dir, "notes.txt"), []byte("<html>this is a web page</html>\n"), 0o644))
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := "e2e-bi-bad-" + string(rune('a'+i))
			createBackingImage(t, name, downloadSpec(tc.url, tc.checksum))
			bi := waitBackingImage(t, name, time.Minute, "a failed copy", func(bi *v1beta1.BackingImage) bool {
				return strings.Contains(bi.Status.Message, tc.want[0])
			})
			for _, w := range tc.want {
				assert.Contains(t, bi.Status.Message, w)
			}
			assert.Contains(t, kubectl(t, "-n", ns, "get", "bi", name, "-o", "wide"), "0/1", "printer column copies")
			if tc.retried {
				// Retried with back-off: 5 s after the first failure, then 10 s.
				bi = waitBackingImage(t, name, 30*time.Second, "a second attempt", secondAttempt)
			}
			assert.NotContains(t, strings.Join(listCopyFiles(t, bi), " "), "/backing ", "no copy exists")
		})
	}
	assert.Empty(t, srv.rangesFor("/notes.txt"), "a failed image is fetched afresh, not resumed")
}

// kill -9 of the manager in the middle of a download: no file under the
// copy's final name exists meanwhile, and after the restart the download
// resumes with an HTTP Range request and ends with the right image.
func TestBackingImageDownloadSurvivesManagerKill(t *testing.T) {
	srv := startImageServer(t)
	_, sum := rawTestImage(t, srv.dir, "slow.raw", 48<<20)
	srv.bytesPerSecond.Store(6 << 20)
	defer srv.bytesPerSecond.Store(0)
	createBackingImage(t, "e2e-bi-kill", downloadSpec(srv.url+"/slow.raw", sum))
	bi := waitBackingImage(t, "e2e-bi-kill", time.Minute, "downloading, past 20%", func(bi *v1beta1.BackingImage) bool {
		st := bi.Status.DiskFileStatusMap[bi.Status.FirstCopyDisk]
		return st != nil && st.State == v1beta1.BackingImageStateInProgress && st.Progress >= 20
	})
	node := nodeOfDisk(t, bi.Status.FirstCopyDisk)
	mgr := env.managers[node]
	require.NoError(t, mgr.Kill())
	t.Logf("killed %s's manager at %d%% of the download", node, bi.Status.DiskFileStatusMap[bi.Status.FirstCopyDisk].Progress)
	final := copyPath(t, bi, node)
	part, err := os.Stat(filepath.Join(filepath.Dir(final), "source.part"))
	require.NoError(t, err, "the partial download is kept for resuming")
	assert.Greater(t, part.Size(), int64(0))
	assert.NoFileExists(t, final, "a half-fetched image never has the copy's name")
	srv.bytesPerSecond.Store(0)
	restarted, err := mgr.Restart(env.managerOpts)
	require.NoError(t, err)
	env.managers[node] = restarted

	bi = waitBackingImage(t, "e2e-bi-kill", 2*time.Minute, "the copy ready after the restart", allCopiesReady(1))
	assert.Equal(t, sum, bi.Status.Checksum)
	assert.Equal(t, sum, fileSHA512(t, final))
	assert.NotEmpty(t, srv.rangesFor("/slow.raw"), "the download resumed with a Range request")
	assert.NoFileExists(t, filepath.Join(filepath.Dir(final), "source.part"))
}

// A replica rebuilt on a disk without the image waits for a copy there
// (WaitingForBackingImage), which is requested for it and copied from a
// peer; then it rebuilds, and the volume read from that replica alone holds
// the image and what was written.
func TestBackingImageReplicaWaitsForCopy(t *testing.T) {
	srv := startImageServer(t)
	rawPath, sum := rawTestImage(t, srv.dir, "wait.raw", 16<<20)
	raw, err := os.ReadFile(rawPath)
	require.NoError(t, err)
	disk1, _ := diskOf(t, "node-1")
	spec := downloadSpec(srv.url+"/wait.raw", sum)
	spec.DiskFileSpecMap = map[string]*v1beta1.BackingImageDiskFileSpec{disk1: {}}
	createBackingImage(t, "e2e-bi-wait", spec)

	setNodeScheduling(t, "node-3", false)
	defer setNodeScheduling(t, "node-3", true)
	defer setNodeScheduling(t, "node-2", true)
	defer setNodeScheduling(t, "node-1", true)
	restore := setSetting(t, types.SettingReplicaReplenishmentWaitInterval, "0")
	defer restore()
	createVolume(t, "e2e-bi-wv", "32Mi", 2, func(v *v1beta1.Volume) { v.Spec.BackingImage = "e2e-bi-wait" })
	updateTickets(t, "e2e-bi-wv", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-bi-wv", 2*time.Minute, "attached to node-1", attachedTo("node-1"))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x3c 2M 3M")
	disk3, _ := diskOf(t, "node-3")
	require.NotContains(t, getBackingImage(t, "e2e-bi-wait").Spec.DiskFileSpecMap, disk3, "node-3 holds no copy yet")

	// Watch the volume's replicas from here on: the new one must be seen waiting.
	w, err := env.adminStrata.StrataV1beta1().Replicas(ns).Watch(context.Background(),
		metav1.ListOptions{LabelSelector: types.LabelVolume + "=e2e-bi-wv"})
	require.NoError(t, err)
	defer w.Stop()
	waited := make(chan string, 1)
	go func() {
		for ev := range w.ResultChan() {
			r, ok := ev.Object.(*v1beta1.Replica)
			if !ok || ev.Type == watch.Deleted || r.Spec.NodeID != "node-3" {
				continue
			}
			if c := meta.FindStatusCondition(r.Status.Conditions, "WaitingForBackingImage"); c != nil && c.Status == metav1.ConditionTrue {
				select {
				case waited <- c.Reason + ": " + c.Message:
				default:
				}
			}
		}
	}()

	setNodeScheduling(t, "node-3", true)
	setNodeScheduling(t, "node-2", false)
	for _, r := range replicasOf(t, "e2e-bi-wv") {
		if r.Spec.NodeID == "node-2" {
			require.NoError(t, deleteReplica(r.Name))
		}
	}
	v = waitVolume(t, "e2e-bi-wv", 3*time.Minute, "healthy with a replica on node-3", func(v *v1beta1.Volume) bool {
		if v.Status.Robustness != v1beta1.VolumeRobustnessHealthy {
			return false
		}
		for _, r := range replicasOf(t, "e2e-bi-wv") {
			if r.Spec.NodeID == "node-3" && r.Spec.HealthyAt != "" {
				return true
			}
		}
		return false
	})
	select {
	case why := <-waited:
		t.Logf("the replica on node-3 waited: %s", why)
	case <-time.After(5 * time.Second):
		t.Fatal("the replica on node-3 was never seen waiting for the image")
	}
	bi := getBackingImage(t, "e2e-bi-wait")
	require.Equal(t, v1beta1.BackingImageStateReady, bi.Status.DiskFileStatusMap[disk3].State)
	assert.Equal(t, sum, fileSHA512(t, copyPath(t, bi, "node-3")))

	// Read from node-3's replica alone: take node-1's out too.
	setNodeScheduling(t, "node-1", false)
	for _, r := range replicasOf(t, "e2e-bi-wv") {
		if r.Spec.NodeID == "node-1" {
			require.NoError(t, deleteReplica(r.Name))
		}
	}
	v = waitVolume(t, "e2e-bi-wv", 2*time.Minute, "one replica, on node-3", func(v *v1beta1.Volume) bool {
		reps := replicasOf(t, "e2e-bi-wv")
		return len(reps) == 1 && reps[0].Spec.NodeID == "node-3" && v.Status.FrontendEndpoint != ""
	})
	want := append([]byte(nil), raw...)
	for i := 2 << 20; i < 5<<20; i++ {
		want[i] = 0x3c
	}
	assertVolumeHoldsImage(t, v.Status.FrontendEndpoint, want)
}

// nodeOfDisk is the node whose disk has the UUID.
func nodeOfDisk(t *testing.T, disk string) string {
	t.Helper()
	for _, n := range nodeNames {
		if d, _ := diskOf(t, n); d == disk {
			return n
		}
	}
	t.Fatalf("no node has disk %s", disk)
	return ""
}

// listCopyFiles lists the files of an image's directories on every node.
func listCopyFiles(t *testing.T, bi *v1beta1.BackingImage) []string {
	var out []string
	for _, n := range nodeNames {
		entries, _ := os.ReadDir(filepath.Dir(copyPath(t, bi, n)))
		for _, e := range entries {
			out = append(out, filepath.Join(filepath.Dir(copyPath(t, bi, n)), e.Name())+" ")
		}
	}
	return out
}

// An image exported from a volume: the first copy is a snapshot of the
// volume streamed from its engine (the volume attached for it through a
// bim-ds-controller ticket owned by the image); a volume on the image reads
// the source's bytes as they were at the snapshot; afterwards the ticket
// and the image's snapshot are gone.
func TestBackingImageExportFromVolume(t *testing.T) {
	createVolume(t, "e2e-bi-src", "16Mi", 1)
	waitVolume(t, "e2e-bi-src", time.Minute, "detached", isDetached)
	useOn(t, "e2e-bi-src", "node-2", "write -P 0x5e 0 6M", "write -P 0x6f 12M 1M")
	createBackingImage(t, "e2e-bi-export", v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeExportFromVolume,
		SourceParameters: map[string]string{v1beta1.BackingImageParameterVolumeName: "e2e-bi-src",
			v1beta1.BackingImageParameterExportType: v1beta1.BackingImageExportTypeRaw}})
	bi := waitBackingImage(t, "e2e-bi-export", 2*time.Minute, "exported", allCopiesReady(1))
	assert.Equal(t, int64(16<<20), bi.Status.VirtualSize)
	want := make([]byte, 16<<20)
	for i := range 6 << 20 {
		want[i] = 0x5e
	}
	for i := 12 << 20; i < 13<<20; i++ {
		want[i] = 0x6f
	}
	assert.Equal(t, sha512Hex(want), bi.Status.Checksum)

	createVolume(t, "e2e-bi-fromexp", "16Mi", 2, func(v *v1beta1.Volume) { v.Spec.BackingImage = "e2e-bi-export" })
	updateTickets(t, "e2e-bi-fromexp", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-bi-fromexp", 2*time.Minute, "attached to node-1", attachedTo("node-1"))
	assertVolumeHoldsImage(t, v.Status.FrontendEndpoint, want)

	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Get(context.Background(), "bi-e2e-bi-export-"+bi.Status.UUID, metav1.GetOptions{})
		if err == nil {
			return false
		}
		for id := range getVA(t, "e2e-bi-src").Spec.AttachmentTickets {
			if strings.HasPrefix(id, "bim-ds-") {
				return false
			}
		}
		return true
	}, time.Minute, 200*time.Millisecond, "the export's snapshot and ticket are released")
	waitVolume(t, "e2e-bi-src", time.Minute, "detached again", isDetached)
}
