package e2e

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
	t.Parallel() // objects of its own, no fault
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

// Hostile images (issue 24). A qcow2 whose data is a file of the host
// (data_file=…, data_file_raw=on), downloaded or uploaded, fails for good
// with a message that says so, and no byte of that file reaches any copy.
// An xz bomb fails at the virtual size cap, leaves no work file, and the
// node goes on serving images.
func TestBackingImageHostileImagesRefused(t *testing.T) {
	srv := startImageServer(t)
	secret := []byte("e2e-host-secret-")
	hostFile := filepath.Join(t.TempDir(), "host-secret")
	evil := filepath.Join(srv.dir, "evil.qcow2")
	runCmd(t, "qemu-img", "create", "-f", "qcow2", "-o", "data_file="+hostFile+",data_file_raw=on", evil, "4M")
	// Written after create, which sized it: what a converter that follows
	// data_file would copy into the image.
	require.NoError(t, os.WriteFile(hostFile, bytes.Repeat(secret, (4<<20)/len(secret)), 0o600))
	evilBytes, err := os.ReadFile(evil)
	require.NoError(t, err)
	wantRefusal := `qcow2 image with an external data file (data_file="` + hostFile + `"): refused, it would read a file of the host`

	t.Run("data file qcow2, downloaded", func(t *testing.T) {
		createBackingImage(t, "e2e-bi-datafile", downloadSpec(srv.url+"/evil.qcow2", ""))
		bi := waitBackingImage(t, "e2e-bi-datafile", time.Minute, "refused", messageHas("external data file"))
		assert.Contains(t, bi.Status.Message, wantRefusal)
		assert.Contains(t, bi.Status.Message, "not retried until the image's spec changes")
		assertNoCopyHolds(t, bi, secret)
	})
	t.Run("data file qcow2, uploaded", func(t *testing.T) {
		createBackingImage(t, "e2e-bi-datafile-up", v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeUpload})
		waitBackingImage(t, "e2e-bi-datafile-up", time.Minute, "a UUID", func(bi *v1beta1.BackingImage) bool { return bi.Status.UUID != "" })
		code, body := upload(t, env.managers["node-2"].APIAddr, "e2e-bi-datafile-up", evilBytes)
		assert.Equal(t, http.StatusUnprocessableEntity, code, body)
		assert.Contains(t, body, "external data file")
		// A refused upload leaves the image waiting for the right bytes.
		assertNoCopyHolds(t, getBackingImage(t, "e2e-bi-datafile-up"), secret)
	})
	t.Run("xz bomb", func(t *testing.T) {
		restore := setSetting(t, types.SettingBackingImageMaxVirtualSize, "1") // GiB
		defer restore()
		// 1200 MiB of zeros, a few hundred KiB of xz: past the 1 GiB cap
		// and the 1/16 a qcow2's tables may add.
		runCmd(t, "sh", "-c", "head -c 1200M /dev/zero | xz -1 -T1 > "+filepath.Join(srv.dir, "bomb.xz"))
		createBackingImage(t, "e2e-bi-bomb", downloadSpec(srv.url+"/bomb.xz", ""))
		bi := waitBackingImage(t, "e2e-bi-bomb", 3*time.Minute, "stopped at the cap", messageHas("decompresses to more than"))
		assert.Contains(t, bi.Status.Message, "the xz stream decompresses to more than 1140850688 bytes (the virtual size cap of 1Gi")
		assert.Contains(t, bi.Status.Message, "not retried until the image's spec or the setting backing-image-max-virtual-size changes")
		assert.NotContains(t, strings.Join(listCopyFiles(t, bi), ""), ".tmp", "no work file left")

		_, sum := rawTestImage(t, srv.dir, "after-bomb.raw", 4<<20)
		spec := downloadSpec(srv.url+"/after-bomb.raw", sum)
		spec.DiskFileSpecMap = map[string]*v1beta1.BackingImageDiskFileSpec{bi.Status.FirstCopyDisk: {}}
		createBackingImage(t, "e2e-bi-after-bomb", spec)
		waitBackingImage(t, "e2e-bi-after-bomb", time.Minute, "the same disk serves the next image", allCopiesReady(1))
		// Gone before the cap is restored: a changed cap retries the
		// copies it refused, and this one would then unpack in full.
		deleteBackingImage(t, "e2e-bi-bomb")
		restore()
	})
}

// Downloads reach neither link-local addresses (the cloud metadata
// endpoint) nor loopback unless backing-image-download-allowed-networks
// admits them (the suite allows 127.0.0.0/8: its image servers listen on
// loopback). The refusal happens at connect time, is not retried, and
// allowing loopback again fetches the held copy without a spec change.
func TestBackingImageDownloadAddressesRefused(t *testing.T) {
	restore := setSetting(t, types.SettingBackingImageDownloadAllowedNetworks, "")
	defer restore()
	srv := startImageServer(t)
	_, sum := rawTestImage(t, srv.dir, "local.raw", 4<<20)
	tests := [2]struct {
		name, image, url, want string
	}{
		{name: "metadata endpoint", image: "e2e-bi-metadata", url: "http://169.254.169.254/latest/meta-data/",
			want: "connecting to 169.254.169.254:80 refused: a link-local address"},
		{name: "loopback", image: "e2e-bi-loopback", url: srv.url + "/local.raw", want: "refused: a loopback address"},
	}
	// The images belong to the whole test (no subtests): the loopback one
	// must outlive its check to be fetched at the end.
	for _, tc := range tests {
		createBackingImage(t, tc.image, downloadSpec(tc.url, ""))
	}
	for _, tc := range tests {
		bi := waitBackingImage(t, tc.image, time.Minute, tc.name+" refused", messageHas("refused"))
		assert.Contains(t, bi.Status.Message, tc.want, tc.name)
		assert.Contains(t, bi.Status.Message,
			"not retried until the image's spec or the setting backing-image-download-allowed-networks changes", tc.name)
	}
	// That a refusal is not retried is shown by the controller's unit tests
	// (TestBackingImageHoldFailed) without waiting out a back-off here.
	assert.Zero(t, srv.getsOf("/local.raw"), "no request reached the loopback server")

	deleteBackingImage(t, "e2e-bi-metadata") // refused still; its retry is not the subject here
	restore()
	bi := waitBackingImage(t, "e2e-bi-loopback", time.Minute, "fetched once loopback is allowed", func(bi *v1beta1.BackingImage) bool {
		return allCopiesReady(1)(bi) && bi.Status.Checksum != ""
	})
	assert.Equal(t, sum, bi.Status.Checksum)
}

// A server that stops sending in the middle of the image: the attempt
// fails after the stall timeout (a minute), is retried after its back-off,
// and the retry resumes where the first stopped.
func TestLongBackingImageStalledDownloadRetried(t *testing.T) {
	dir := t.TempDir()
	rawPath, sum := rawTestImage(t, dir, "stall.raw", 8<<20)
	data, err := os.ReadFile(rawPath)
	require.NoError(t, err)
	url, ranges := startStallingServer(t, data, 1<<20)

	createBackingImage(t, "e2e-bi-stall", downloadSpec(url, sum))
	waitBackingImage(t, "e2e-bi-stall", 3*time.Minute, "the stalled attempt failed", messageHas("no data from the server for 1m0s"))
	bi := waitBackingImage(t, "e2e-bi-stall", 2*time.Minute, "ready after the retry", allCopiesReady(1))
	assert.Equal(t, sum, bi.Status.Checksum)
	assertEvent(t, "e2e-bi-stall", "CopyFailed", "stalled")
	assert.Equal(t, []string{"bytes=1048576-"}, ranges(), "the retry asked for the rest only")
}

// startStallingServer serves data on loopback: the first GET sends the
// first stallAt bytes and then nothing until the client leaves; later GETs
// are served in full (Range included). ranges lists the Range headers seen.
func startStallingServer(t *testing.T, data []byte, stallAt int) (url string, ranges func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	first := true
	done := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		stall := first
		first = false
		if rg := r.Header.Get("Range"); rg != "" {
			seen = append(seen, rg)
		}
		mu.Unlock()
		if !stall {
			http.ServeContent(w, r, "stall.raw", time.Time{}, bytes.NewReader(data))
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		_, _ = w.Write(data[:stallAt])
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-done:
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { close(done); _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/stall.raw", func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// messageHas: the image's status message contains s.
func messageHas(s string) func(*v1beta1.BackingImage) bool {
	return func(bi *v1beta1.BackingImage) bool { return strings.Contains(bi.Status.Message, s) }
}

// assertNoCopyHolds: no file in the image's directories on any node holds
// needle.
func assertNoCopyHolds(t *testing.T, bi *v1beta1.BackingImage, needle []byte) {
	t.Helper()
	for _, f := range listCopyFiles(t, bi) {
		b, err := os.ReadFile(strings.TrimSpace(f))
		if err == nil {
			assert.False(t, bytes.Contains(b, needle), "%s holds bytes of the host file", f)
		}
	}
}
