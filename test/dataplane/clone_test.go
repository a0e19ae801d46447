package dataplane

import (
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

// createEngine makes a volume of size bytes with one replica on each node
// and its engine on the first, serving NBD only if frontend is "nbd".
func createEngine(t *testing.T, name string, size int64, nodes []*node, frontend string) *volume {
	t.Helper()
	ctx := context.Background()
	v := &volume{name: name, nodes: nodes, replicas: map[string]string{}, engine: name + "-e"}
	for i, n := range nodes {
		rname := name + "-r" + string(rune('1'+i))
		inst, err := n.client(t).InstanceCreate(ctx, &impb.InstanceCreateRequest{
			Name: rname, Type: impb.InstanceType_INSTANCE_TYPE_REPLICA, VolumeName: name, Size: size,
			DataDir: filepath.Join(n.diskDir, rname)})
		require.NoError(t, err)
		v.replicas[rname] = inst.Address
	}
	inst, err := nodes[0].client(t).InstanceCreate(ctx, &impb.InstanceCreateRequest{
		Name: v.engine, Type: impb.InstanceType_INSTANCE_TYPE_ENGINE, VolumeName: name, Size: size,
		Replicas: v.replicas, Frontend: frontend})
	require.NoError(t, err)
	require.Len(t, inst.ReplicaModes, len(nodes))
	v.endpoint = inst.FrontendEndpoint
	return v
}

// exportTo streams a snapshot over gRPC into a new local file, applying the
// chunks in order as the API asks, and returns the file.
func exportTo(t *testing.T, v *volume, snapshot string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), snapshot+".export")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	chunks := 0
	err = v.im(t).SnapshotExport(ctx, v.engine, snapshot, func(c *impb.ExportChunk) error {
		if chunks == 0 {
			require.Equal(t, int64(volSize), c.VolumeSize, "the first chunk carries the volume size")
			require.NoError(t, f.Truncate(c.VolumeSize))
		} else {
			require.Zero(t, c.VolumeSize, "only the first chunk carries the volume size")
		}
		chunks++
		require.LessOrEqual(t, len(c.Data), 1<<20, "a chunk holds at most 1 MiB")
		require.LessOrEqual(t, c.Offset+int64(len(c.Data)), int64(volSize))
		_, err := f.WriteAt(c.Data, c.Offset)
		return err
	})
	require.NoError(t, err, "export %s", snapshot)
	require.Positive(t, chunks)
	return path
}

// cloneProgressSeen collects the clone statuses Watch reports for engine
// until an event shows the clone gone again.
func cloneProgressSeen(next func() (*impb.WatchEvent, error), engine string) []*impb.CloneStatus {
	var seen []*impb.CloneStatus
	for {
		ev, err := next()
		if err != nil {
			return seen
		}
		if ev.Instance.GetName() != engine {
			continue
		}
		if st := ev.Instance.GetCloneStatus(); st != nil {
			seen = append(seen, st)
		} else if len(seen) > 0 {
			return seen
		}
	}
}

func clone(v *volume, t *testing.T, source, snapshot string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return v.im(t).SnapshotClone(ctx, engineapi.SnapshotCloneArgs{Engine: v.engine, SourceAddress: source, Snapshot: snapshot})
}

// Export and clone a snapshot that spans several layers: s1 sits on s0 and
// overrides part of it (with data and with zeros), and the head moved on
// after s2. Both must give exactly what qemu-io makes of the same writes
// on a raw file.
func TestSnapshotExportAndClone(t *testing.T) {
	nodes := threeNodes(t)
	a := createVolume(t, "cla", nodes[:1])
	src := a.replicas["cla-r1"]
	ctx := context.Background()

	step0 := []string{"write -P 0x01 0 16M", "write -P 0x02 48M 2M", "write -P 0x03 63M 1M"}
	stepA := []string{"write -P 0x11 4M 4M", "write -z 8M 1M", "write -P 0x12 32M 1M", "write -P 0x13 1000 3000",
		"write -P 0x14 49M 4k"}
	stepB := []string{"write -P 0x22 0 20M", "write -z 48M 2M", "write -P 0x23 40M 1M"}
	img0 := expected(t, volSize, "s0", step0...)
	img1 := expected(t, volSize, "s1", append(append([]string{}, step0...), stepA...)...)
	img2 := expected(t, volSize, "s2", append(append(append([]string{}, step0...), stepA...), stepB...)...)

	qemuIO(t, a.endpoint, step0...)
	a.snapshot(t, "s0")
	qemuIO(t, a.endpoint, stepA...)
	a.snapshot(t, "s1")
	qemuIO(t, a.endpoint, stepB...)
	a.snapshot(t, "s2")
	qemuIO(t, a.endpoint, "write -P 0x44 0 64M", "flush") // the head moves on; no snapshot sees it

	assert.Equal(t, sha256File(t, img0), sha256File(t, exportTo(t, a, "s0")), "export s0")
	assert.Equal(t, sha256File(t, img1), sha256File(t, exportTo(t, a, "s1")), "export s1")
	assert.Equal(t, sha256File(t, img2), sha256File(t, exportTo(t, a, "s2")), "export s2")

	// Clone s1 into B, whose engine and replicas are on the other nodes.
	b := createVolume(t, "clb", nodes[1:])
	assert.ErrorIs(t, clone(b, t, src, "s1"), engineapi.ErrBusy, "clone needs the frontend stopped")
	_, err := b.im(t).FrontendStop(ctx, b.engine)
	require.NoError(t, err)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	next, err := b.im(t).Watch(watchCtx)
	require.NoError(t, err)
	progress := make(chan []*impb.CloneStatus, 1)
	go func() { progress <- cloneProgressSeen(next, b.engine) }()
	require.NoError(t, clone(b, t, src, "s1"))
	seen := <-progress
	require.NotEmpty(t, seen, "Watch reported the clone's progress")
	for i, st := range seen {
		assert.Equal(t, "s1", st.Snapshot)
		assert.Equal(t, src, st.SourceAddress)
		if i > 0 {
			assert.GreaterOrEqual(t, st.Progress, seen[i-1].Progress, "progress never goes back")
		}
	}
	last := seen[len(seen)-1]
	assert.Equal(t, int32(100), last.Progress, "the last report before the end is 100%%")
	assert.Positive(t, last.BytesTotal)
	assert.Equal(t, last.BytesTotal, last.BytesDone)
	inst, err := b.im(t).FrontendStart(ctx, b.engine, "nbd")
	require.NoError(t, err)
	b.endpoint = inst.FrontendEndpoint
	for r, m := range inst.ReplicaModes {
		assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, m, "replica %s", r)
	}
	assert.Equal(t, sha256File(t, img1), readVolume(t, b.endpoint), "B is a clone of s1")
	tool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", b.endpoint, img1)
	// Every replica of B got the data, not only those NBD happened to read:
	// read with each one alone.
	require.NoError(t, b.im(t).ReplicaRemove(ctx, b.engine, "clb-r1"))
	assert.Equal(t, sha256File(t, img1), readVolume(t, b.endpoint), "clb-r2 holds s1")
	require.NoError(t, b.im(t).ReplicaAdd(ctx, b.engine, "clb-r1", b.replicas["clb-r1"], false))
	require.NoError(t, b.im(t).ReplicaRemove(ctx, b.engine, "clb-r2"))
	assert.Equal(t, sha256File(t, img1), readVolume(t, b.endpoint), "clb-r1 holds s1")

	// A removed snapshot's child still reads through it, before and after a
	// purge coalesces the two.
	require.NoError(t, a.im(t).SnapshotRemove(ctx, a.engine, "s0"))
	assert.Equal(t, sha256File(t, img1), sha256File(t, exportTo(t, a, "s1")), "export s1 over removed s0")
	a.purge(t)
	assert.Equal(t, sha256File(t, img1), sha256File(t, exportTo(t, a, "s1")), "export s1 after purging s0 into it")

	// A clone into a volume whose head holds data starts from zeros.
	c := createEngine(t, "clc", volSize, nodes[2:], "nbd")
	qemuIO(t, c.endpoint, "write -P 0x55 0 64M")
	_, err = c.im(t).FrontendStop(ctx, c.engine)
	require.NoError(t, err)
	require.NoError(t, clone(c, t, src, "s2"))
	inst, err = c.im(t).FrontendStart(ctx, c.engine, "nbd")
	require.NoError(t, err)
	assert.Equal(t, sha256File(t, img2), readVolume(t, inst.FrontendEndpoint), "C is a clone of s2")
}

func TestSnapshotExportAndCloneErrors(t *testing.T) {
	nodes := []*node{startNode(t, "node-1"), startNode(t, "node-2")}
	a := createVolume(t, "era", nodes[:1])
	src := a.replicas["era-r1"]
	ctx := context.Background()
	c := a.im(t)
	a.snapshot(t, "s1")
	a.snapshot(t, "gone")
	require.NoError(t, c.SnapshotRemove(ctx, a.engine, "gone"))

	export := func(engine, snap string) error {
		return c.SnapshotExport(ctx, engine, snap, func(*impb.ExportChunk) error { return nil })
	}
	assert.ErrorIs(t, export(a.engine, "nope"), engineapi.ErrNotFound, "unknown snapshot")
	assert.ErrorIs(t, export("no-engine", "s1"), engineapi.ErrNotFound, "unknown engine")
	assert.ErrorIs(t, export(a.engine, "gone"), engineapi.ErrInvalid, "removed snapshot")
	assert.ErrorIs(t, export(a.engine, "volume-head"), engineapi.ErrInvalid, "the head is not a snapshot")
	assert.ErrorIs(t, export(a.engine, ""), engineapi.ErrInvalid, "empty name")
	assert.ErrorIs(t, export(a.engine+"x", "s1"), engineapi.ErrNotFound)
	// A snapshot without data is one empty chunk that tells the size.
	var chunks []*impb.ExportChunk
	require.NoError(t, c.SnapshotExport(ctx, a.engine, "s1", func(ch *impb.ExportChunk) error {
		chunks = append(chunks, ch)
		return nil
	}))
	require.Len(t, chunks, 1)
	assert.Equal(t, int64(volSize), chunks[0].VolumeSize)
	assert.Empty(t, chunks[0].Data)

	b := createEngine(t, "erb", volSize, nodes[1:], "")
	assert.ErrorIs(t, clone(b, t, src, "nope"), engineapi.ErrNotFound, "unknown snapshot")
	assert.ErrorIs(t, clone(b, t, src, "gone"), engineapi.ErrInvalid, "removed snapshot")
	assert.ErrorIs(t, clone(b, t, src, "volume-head"), engineapi.ErrInvalid, "the source's head")
	assert.ErrorIs(t, clone(b, t, "", "s1"), engineapi.ErrInvalid, "no source address")
	assert.Error(t, clone(b, t, "127.0.0.1:1", "s1"), "unreachable source")
	assert.ErrorIs(t, c.SnapshotClone(ctx, engineapi.SnapshotCloneArgs{Engine: "no-engine", SourceAddress: src, Snapshot: "s1"}), engineapi.ErrNotFound, "unknown target")

	small := createEngine(t, "ers", volSize/2, nodes[1:], "")
	assert.ErrorIs(t, clone(small, t, src, "s1"), engineapi.ErrInvalid, "target smaller than the source")

	_, err := b.im(t).SnapshotCreate(ctx, b.engine, "own", true, nil, 0)
	require.NoError(t, err)
	assert.ErrorIs(t, clone(b, t, src, "s1"), engineapi.ErrInvalid, "the target has snapshots of its own")

	inst, err := b.im(t).InstanceGet(ctx, b.engine)
	require.NoError(t, err)
	for r, m := range inst.ReplicaModes {
		assert.Equal(t, impb.ReplicaMode_REPLICA_MODE_RW, m, "refusals fail no replica (%s)", r)
	}
}
