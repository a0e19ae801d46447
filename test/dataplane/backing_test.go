package dataplane

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// imageLen is the backing image's length: shorter than the volume, and not
// a whole number of blocks, so the volume reads the image's last partial
// block and then zeros.
const imageLen = 20<<20 + 1000

// writeBackingImage writes a raw image with recognisable data: 256 KiB
// stretches of a byte that names the stretch, every third one a hole
// (never written), and 1000 bytes of 0x7e after the last whole MiB. It
// returns how many bytes hold data.
func writeBackingImage(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	const stretch = 256 << 10
	var data int64
	for i := range (20 << 20) / stretch {
		if i%3 == 1 {
			continue
		}
		_, err := f.WriteAt(bytes.Repeat([]byte{byte(0x30 + i)}, stretch), int64(i)*stretch)
		require.NoError(t, err)
		data += stretch
	}
	_, err = f.WriteAt(bytes.Repeat([]byte{0x7e}, 1000), 20<<20)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(imageLen))
	return data + 1000
}

// copyImage copies an image to another path as another disk would hold
// it: the same bytes, but written out whole (the holes become allocated
// zeros), so the copy's extents differ from the original's.
func copyImage(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
	require.NoError(t, os.WriteFile(to, data, 0o644))
}

// expectedOver is what a volume on image reads after cmds: qemu-io's
// writes on a raw file that starts as the image, grown to the volume size.
func expectedOver(t *testing.T, image, name string, cmds ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".img")
	copyImage(t, image, path)
	require.NoError(t, os.Truncate(path, volSize))
	if len(cmds) > 0 {
		qemuIO(t, path, cmds...)
	}
	return path
}

// createReplicaOn makes a replica of volume name on n, on its own copy of
// image (none if image is ""), and returns its dataconn address.
func createReplicaOn(t *testing.T, n *node, volume, rname, image string) string {
	t.Helper()
	req := &impb.InstanceCreateRequest{Name: rname, Type: impb.InstanceType_INSTANCE_TYPE_REPLICA,
		VolumeName: volume, Size: volSize, DataDir: filepath.Join(n.diskDir, rname)}
	if image != "" {
		req.BackingFile = filepath.Join(n.diskDir, "backing-images", rname+".raw")
		copyImage(t, image, req.BackingFile)
	}
	inst, err := n.client(t).InstanceCreate(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, inst.State)
	return inst.Address
}

// createBackedVolume is createEngine with every replica on a copy of image
// of its node's own.
func createBackedVolume(t *testing.T, name string, nodes []*node, frontend, image string) *volume {
	t.Helper()
	v := &volume{name: name, nodes: nodes, replicas: map[string]string{}, engine: name + "-e"}
	for i, n := range nodes {
		rname := name + "-r" + string(rune('1'+i))
		v.replicas[rname] = createReplicaOn(t, n, name, rname, image)
	}
	inst, err := nodes[0].client(t).InstanceCreate(context.Background(), &impb.InstanceCreateRequest{
		Name: v.engine, Type: impb.InstanceType_INSTANCE_TYPE_ENGINE, VolumeName: name, Size: volSize,
		Replicas: v.replicas, Frontend: frontend})
	require.NoError(t, err)
	for r, m := range inst.ReplicaModes {
		require.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, m, "replica %s", r)
	}
	v.endpoint = inst.FrontendEndpoint
	return v
}

// Writes over part of the image, both partial blocks and zeroing.
var overImage = []string{
	"write -P 0xa1 1M 3M",     // over data and a hole of the image
	"write -z 5M 512k",        // zeros hiding the image
	"write -P 0xa2 19M 2M",    // across the image's end
	"write -P 0xa3 1000 3000", // a partial block over the image
}

// A replica rebuilt onto a fresh replica whose backing file is another
// copy of the image (another path, another disk) reads exactly as the
// volume, also with writes the rebuild ran alongside; a fresh replica
// without the image is refused.
func TestReplicaRebuildOnBackingImage(t *testing.T) {
	nodes := threeNodes(t)
	image := filepath.Join(t.TempDir(), "image.raw")
	writeBackingImage(t, image)
	v := createBackedVolume(t, "bk", nodes[:2], "nbd", image)
	ctx := context.Background()
	c := v.im(t)

	history := append([]string{}, overImage...)
	qemuIO(t, v.endpoint, history...)
	v.snapshot(t, "s1")
	more := []string{"write -P 0xb1 10M 1M", "write -P 0xb2 4095 2", "write -z 20M 4k"}
	qemuIO(t, v.endpoint, more...)
	history = append(history, more...)
	require.Equal(t, sha256File(t, expectedOver(t, image, "before", history...)), readVolume(t, v.endpoint),
		"the volume reads the image under its writes")

	noImage := createReplicaOn(t, nodes[2], v.name, "bk-bare", "")
	assert.ErrorIs(t, c.ReplicaAdd(ctx, v.engine, "bk-bare", noImage, true), engineapi.ErrInvalid,
		"a replica without the image cannot be rebuilt from one with it")

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next, err := c.Watch(wctx)
	require.NoError(t, err)
	stream := startWriteStream(v.endpoint, 7)
	stream.waitBatches(t, 2)
	r3 := createReplicaOn(t, nodes[2], v.name, "bk-r3", image)
	require.NoError(t, c.ReplicaAdd(ctx, v.engine, "bk-r3", r3, true))
	watchUntil(t, next, v.engine, "bk-r3 rebuilt and RW", func(i *impb.Instance) bool {
		return i.RebuildStatus["bk-r3"].GetState() == "complete" && i.ReplicaModes["bk-r3"] == impb.ReplicaMode_REPLICA_MODE_RW
	})
	stream.waitBatches(t, 2)
	acked := stream.halt(t)

	want := sha256File(t, expectedOver(t, image, "want", append(history, acked...)...))
	assert.Equal(t, want, readVolume(t, v.endpoint), "the volume holds the image and every write")
	// Only the rebuilt replica left: it reads the same.
	for _, r := range []string{"bk-r1", "bk-r2"} {
		require.NoError(t, c.ReplicaRemove(ctx, v.engine, r))
	}
	inst, err := c.InstanceGet(ctx, v.engine)
	require.NoError(t, err)
	require.Equal(t, map[string]impb.ReplicaMode{"bk-r3": impb.ReplicaMode_REPLICA_MODE_RW}, inst.ReplicaModes)
	assert.Equal(t, want, readVolume(t, v.endpoint), "the rebuilt replica alone holds the image and every write")
	tool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", v.endpoint, expectedOver(t, image, "cmp", append(history, acked...)...))
}

// An export of a snapshot of a volume on a backing image holds the image's
// bytes (zeros past its end) under the snapshot's writes; a clone reads the
// same, whether it copied the image into a volume without one or left it
// to the target's own copy (BackingShared).
func TestExportAndCloneOnBackingImage(t *testing.T) {
	nodes := threeNodes(t)
	image := filepath.Join(t.TempDir(), "image.raw")
	imageData := writeBackingImage(t, image)
	a := createBackedVolume(t, "bx", nodes[:1], "nbd", image)
	src := a.replicas["bx-r1"]
	ctx := context.Background()

	qemuIO(t, a.endpoint, overImage...)
	a.snapshot(t, "s1")
	qemuIO(t, a.endpoint, "write -P 0x44 0 24M", "flush") // the head moves on; s1 does not see it
	want := sha256File(t, expectedOver(t, image, "s1", overImage...))
	assert.Equal(t, want, sha256File(t, exportTo(t, a, "s1")), "export s1")

	tests := []struct {
		name     string
		onImage  bool // the target's replicas have copies of the image
		shared   bool
		copiesIt bool // the image's data lands in the target's head
	}{
		{name: "copied into a volume without backing image", copiesIt: true},
		{name: "shared with a volume on the same image", onImage: true, shared: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := "bc" + string(rune('a'+i))
			img := ""
			if tc.onImage {
				img = image
			}
			b := createBackedVolume(t, name, nodes[1:], "", img)
			cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			require.NoError(t, b.im(t).SnapshotClone(cctx, engineapi.SnapshotCloneArgs{Engine: b.engine,
				SourceAddress: src, Snapshot: "s1", BackingShared: tc.shared}))
			inst, err := b.im(t).FrontendStart(ctx, b.engine, "nbd")
			require.NoError(t, err)
			assert.Equal(t, want, readVolume(t, inst.FrontendEndpoint), "the clone reads as s1")
			tool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", inst.FrontendEndpoint,
				expectedOver(t, image, "cmp", overImage...))
			snaps, err := b.im(t).SnapshotList(ctx, b.engine)
			require.NoError(t, err)
			head := snaps["volume-head"].GetSize()
			if tc.copiesIt {
				assert.GreaterOrEqual(t, head, imageData, "the image's data was copied")
			} else {
				assert.Less(t, head, imageData, "only s1's own blocks were copied")
			}
		})
	}
}
