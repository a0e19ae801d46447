package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// The seed's "basic operation" plan, with a qcow2 image served by a local
// HTTP server: the image is fetched, a 3-replica volume on it gets a ready
// copy on every disk, reads the image's bytes through NBD (equal to
// qemu-img convert -O raw of the qcow2), and writes never touch the copies;
// cleaning up a used disk and deleting the used image are refused; once the
// volume is gone one disk is cleaned up (terminating, then gone with its
// file) and the image is deleted with every file.
func TestBackingImageBasicOperation(t *testing.T) {
	srv := startImageServer(t)
	rawPath, sum := rawTestImage(t, srv.dir, "basic.raw", 24<<20)
	runCmd(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", rawPath, filepath.Join(srv.dir, "basic.qcow2"))
	// What qemu-img makes of the qcow2 is what the volume must read.
	expectRaw := filepath.Join(t.TempDir(), "expect.raw")
	runCmd(t, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", filepath.Join(srv.dir, "basic.qcow2"), expectRaw)
	expect, err := os.ReadFile(expectRaw)
	require.NoError(t, err)
	require.Equal(t, sum, sha512Hex(expect))

	createBackingImage(t, "e2e-bi-basic", downloadSpec(srv.url+"/basic.qcow2", sum))
	bi := waitBackingImage(t, "e2e-bi-basic", 2*time.Minute, "first copy ready", allCopiesReady(1))
	assert.Equal(t, int64(24<<20), bi.Status.VirtualSize)
	assert.Equal(t, sum, bi.Status.Checksum)
	assert.Greater(t, bi.Status.Size, int64(0), "the qcow2's size")

	createVolume(t, "e2e-bi-vol", "64Mi", 3, func(v *v1beta1.Volume) { v.Spec.BackingImage = "e2e-bi-basic" })
	updateTickets(t, "e2e-bi-vol", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-bi-vol", 3*time.Minute, "attached to node-1", attachedTo("node-1"))
	bi = waitBackingImage(t, "e2e-bi-basic", time.Minute, "a ready copy on each of the 3 disks", allCopiesReady(3))
	assert.Equal(t, "3/3", bi.Status.Copies)
	for _, node := range nodeNames {
		assert.Equal(t, sum, fileSHA512(t, copyPath(t, bi, node)), "the copy on %s", node)
	}
	// Each replica's condition turns False with the status write that
	// follows its start (which a conflict may delay a moment).
	require.Eventually(t, func() bool {
		for _, r := range replicasOf(t, "e2e-bi-vol") {
			if c := meta.FindStatusCondition(r.Status.Conditions, "WaitingForBackingImage"); c == nil || c.Status != "False" {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "every replica says it no longer waits for the image")
	assertVolumeHoldsImage(t, v.Status.FrontendEndpoint, expect)
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x77 0 2M", "write -P 0x78 20M 8M")
	qemuIO(t, v.Status.FrontendEndpoint, "read -P 0x77 0 2M", "read -P 0x78 20M 8M")
	for _, node := range nodeNames {
		assert.Equal(t, sum, fileSHA512(t, copyPath(t, bi, node)), "writes left the copy on %s alone", node)
	}

	disk1, _ := diskOf(t, "node-1")
	out, err := tryKubectl(t, "-n", ns, "patch", "backingimage", "e2e-bi-basic", "--type=json",
		"-p", `[{"op":"remove","path":"/spec/diskFileSpecMap/`+disk1+`"}]`)
	require.Error(t, err, "cleaning up a disk in use must be refused")
	assert.Contains(t, out, "spec.diskFileSpecMap["+disk1+"]")
	assert.Contains(t, out, "used by replica")
	out, err = tryKubectl(t, "-n", ns, "delete", "backingimage", "e2e-bi-basic", "--wait=false")
	require.Error(t, err, "deleting an image in use must be refused")
	assert.Contains(t, out, "e2e-bi-vol")

	updateTickets(t, "e2e-bi-vol", removeTicket("admin"))
	deleteVolume(t, "e2e-bi-vol")
	waitVolumeGone(t, "e2e-bi-vol")

	kubectl(t, "-n", ns, "patch", "backingimage", "e2e-bi-basic", "--type=json",
		"-p", `[{"op":"remove","path":"/spec/diskFileSpecMap/`+disk1+`"}]`)
	waitBackingImage(t, "e2e-bi-basic", time.Minute, "the copy on node-1 terminating or gone", func(bi *v1beta1.BackingImage) bool {
		st, ok := bi.Status.DiskFileStatusMap[disk1]
		return !ok || st.State == v1beta1.BackingImageStateTerminating
	})
	waitBackingImage(t, "e2e-bi-basic", time.Minute, "the copy on node-1 gone", func(bi *v1beta1.BackingImage) bool {
		_, ok := bi.Status.DiskFileStatusMap[disk1]
		return !ok
	})
	waitGone(t, filepath.Dir(copyPath(t, bi, "node-1")), "node-1's copy")
	assert.FileExists(t, copyPath(t, bi, "node-2"), "the other copies stay")

	deleteBackingImage(t, "e2e-bi-basic")
	for _, node := range nodeNames {
		waitGone(t, filepath.Dir(copyPath(t, bi, node)), node+"'s copy")
	}
}

// The seed's "auto cleanup" plan, in MiB: three volumes share one file per
// disk (every replica's chain names the same inode); with node-3 taken out of
// scheduling and its replicas removed, its copy stays while the cleanup
// interval has not passed, then, with the interval at 0, goes (terminating,
// then removed); the other copies stay and the volumes keep their data.
func TestBackingImageAutoCleanup(t *testing.T) {
	srv := startImageServer(t)
	_, sum := rawTestImage(t, srv.dir, "shared.raw", 16<<20)
	createBackingImage(t, "e2e-bi-shared", downloadSpec(srv.url+"/shared.raw", sum))
	vols := []string{"e2e-bi-s1", "e2e-bi-s2", "e2e-bi-s3"}
	for _, name := range vols {
		createVolume(t, name, "32Mi", 3, func(v *v1beta1.Volume) { v.Spec.BackingImage = "e2e-bi-shared" })
		updateTickets(t, name, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	}
	for i, name := range vols {
		v := waitVolume(t, name, 3*time.Minute, "attached to node-1", attachedTo("node-1"))
		qemuIO(t, v.Status.FrontendEndpoint, "write -P "+string(rune('1'+i))+" 4M 1M")
	}
	bi := waitBackingImage(t, "e2e-bi-shared", time.Minute, "a ready copy on each disk", allCopiesReady(3))

	// One file per disk: every replica there opens the same inode.
	for _, node := range nodeNames {
		want := inode(t, copyPath(t, bi, node))
		for _, name := range vols {
			for _, r := range replicasOf(t, name) {
				if r.Spec.NodeID == node {
					assert.Equal(t, want, inode(t, replicaBackingFile(t, &r)), "replica %s on %s", r.Name, node)
				}
			}
		}
	}

	restore := setSetting(t, types.SettingBackingImageCleanupWaitInterval, "60")
	defer restore()
	setNodeScheduling(t, "node-3", false)
	defer setNodeScheduling(t, "node-3", true)
	disk3, _ := diskOf(t, "node-3")
	for _, name := range vols {
		setReplicaCount(t, name, 2)
		for _, r := range replicasOf(t, name) {
			if r.Spec.NodeID == "node-3" {
				require.NoError(t, deleteReplica(r.Name))
			}
		}
	}
	bi = waitBackingImage(t, "e2e-bi-shared", 2*time.Minute, "node-3's copy unused since some time", func(bi *v1beta1.BackingImage) bool {
		return bi.Status.DiskLastRefAtMap[disk3] != ""
	})
	// The sync that recorded the copy as unused is the one that judged it
	// against the interval, and it writes the spec before that status: had
	// it ignored the interval, this very object would lack node-3's copy.
	// That no later sync removes it before the interval is the controller's
	// unit test's (a fake clock), not a wait here.
	require.Equal(t, v1beta1.BackingImageStateReady, bi.Status.DiskFileStatusMap[disk3].State, "nothing changes before the interval")
	require.Len(t, bi.Spec.DiskFileSpecMap, 3)

	require.NoError(t, setSettingValue(context.Background(), types.SettingBackingImageCleanupWaitInterval, "0"))
	waitBackingImage(t, "e2e-bi-shared", time.Minute, "node-3's copy terminating or gone", func(bi *v1beta1.BackingImage) bool {
		st, ok := bi.Status.DiskFileStatusMap[disk3]
		return !ok || st.State == v1beta1.BackingImageStateTerminating
	})
	bi = waitBackingImage(t, "e2e-bi-shared", time.Minute, "node-3's copy gone", func(bi *v1beta1.BackingImage) bool {
		_, ok := bi.Status.DiskFileStatusMap[disk3]
		return !ok
	})
	waitGone(t, filepath.Dir(copyPath(t, bi, "node-3")), "node-3's copy")
	assert.Equal(t, "2/2", bi.Status.Copies)
	for _, node := range []string{"node-1", "node-2"} {
		assert.Equal(t, sum, fileSHA512(t, copyPath(t, bi, node)))
	}
	for i, name := range vols {
		v := getVolume(t, name)
		qemuIO(t, v.Status.FrontendEndpoint, "read -P "+string(rune('1'+i))+" 4M 1M", "write -P 0x42 8M 1M", "read -P 0x42 8M 1M")
	}
}

// replicaBackingFile is the backing file a replica's volume.meta names.
func replicaBackingFile(t *testing.T, r *v1beta1.Replica) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(r.Spec.DiskPath, "replicas", r.Spec.DataDirectoryName, "volume.meta"))
	require.NoError(t, err)
	var meta struct {
		BackingFile string `json:"backingFile"`
	}
	require.NoError(t, json.Unmarshal(raw, &meta))
	require.NotEmpty(t, meta.BackingFile, "volume.meta of %s names no backing file: %s", r.Name, raw)
	return meta.BackingFile
}
