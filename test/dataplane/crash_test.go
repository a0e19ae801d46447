package dataplane

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi/impb"
)

const crashChunk = 64 << 10

// crashPattern is the byte written at slot i: distinct neighbours, never 0.
func crashPattern(i int) int { return i%251 + 1 }

// crashEngine starts an engine on n over the given replicas and returns its
// NBD endpoint.
func crashEngine(t *testing.T, n *node, name, volume string, replicas map[string]string) string {
	t.Helper()
	inst, err := n.client(t).InstanceCreate(context.Background(), &impb.InstanceCreateRequest{
		Name: name, Type: impb.InstanceType_INSTANCE_TYPE_ENGINE, VolumeName: volume, Size: volSize,
		Replicas: replicas, Frontend: "nbd"})
	require.NoError(t, err)
	require.Len(t, inst.ReplicaModes, len(replicas), "every replica connected")
	t.Cleanup(func() { _, _ = n.client(t).InstanceDelete(context.Background(), name) })
	return inst.FrontendEndpoint
}

var wroteRE = regexp.MustCompile(`wrote \d+/\d+ bytes at offset (\d+)`)

// Kill -9 the instance manager that runs the engine and one replica in the
// middle of a write stream. Every write qemu-io saw acknowledged must be on
// every replica afterwards, the killed node's replica included, and that
// replica's chain must open when its instance manager restarts.
func TestInstanceManagerKilledDuringWrites(t *testing.T) {
	nodes := threeNodes(t)
	v := createVolume(t, "crashw", nodes)
	v.snapshot(t, "before")

	slots := volSize / crashChunk
	args := []string{"-f", "raw"}
	for i := 0; i < slots; i++ {
		args = append(args, "-c", fmt.Sprintf("write -P %d %d %d", crashPattern(i), i*crashChunk, crashChunk))
	}
	cmd := exec.Command("qemu-io", append(args, v.endpoint)...)
	outc := make(chan []byte, 1)
	go func() {
		out, _ := cmd.CombinedOutput() // fails once its server is gone
		outc <- out
	}()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, nodes[0].proc.Kill(), "kill -9 the engine's instance manager")
	out := <-outc

	var acked []int
	for _, m := range wroteRE.FindAllStringSubmatch(string(out), -1) {
		off, _ := strconv.Atoi(m[1])
		acked = append(acked, off/crashChunk)
	}
	t.Logf("%d of %d writes acknowledged before the kill", len(acked), slots)
	require.NotEmpty(t, acked, "the kill came after some writes")
	require.Less(t, len(acked), slots, "the kill came before the stream ended")

	nodes[0].start(t)
	list, err := nodes[0].client(t).InstanceList(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1, "the replica is reopened from disk; the engine is not")
	assert.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, list[0].State, list[0].Error)
	v.replicas[list[0].Name] = list[0].Address

	for rname, addr := range v.replicas {
		t.Run(rname, func(t *testing.T) {
			endpoint := crashEngine(t, nodes[0], "crashw-check-"+rname, "crashw-"+rname, map[string]string{rname: addr})
			var cmds []string
			for _, i := range acked {
				cmds = append(cmds, fmt.Sprintf("read -P %d %d %d", crashPattern(i), i*crashChunk, crashChunk))
			}
			// qemu-io prints "Pattern verification failed" for a mismatch.
			out := qemuIO(t, endpoint, cmds...)
			assert.NotContains(t, out, "verification failed")
			snaps, err := nodes[0].client(t).SnapshotList(context.Background(), "crashw-check-"+rname)
			require.NoError(t, err)
			assert.Contains(t, snaps, "before", "the chain opens with its snapshot")
		})
	}
}

// Kill -9 an instance manager while its replica purges a large removed
// snapshot, several times at different moments: the replica always reopens
// and reads what the volume held, and its remaining snapshot is intact.
func TestInstanceManagerKilledDuringPurge(t *testing.T) {
	nodes := threeNodes(t)
	ctx := context.Background()
	for round, delay := range []time.Duration{0, 5 * time.Millisecond, 20 * time.Millisecond, 60 * time.Millisecond} {
		t.Run(fmt.Sprintf("after-%s", delay), func(t *testing.T) {
			v := createVolume(t, fmt.Sprintf("crashp%d", round), nodes)
			base := []string{"write -P 0x41 0 40M"}
			over := []string{"write -P 0x42 8M 8M", "write -P 0x43 50M 4M"}
			want := expected(t, volSize, "final", append(append([]string{}, base...), over...)...)

			qemuIO(t, v.endpoint, base...)
			v.snapshot(t, "old")
			qemuIO(t, v.endpoint, over...)
			v.snapshot(t, "keep")
			// "old" holds 40 MiB and has one child, so purging it coalesces
			// 40 MiB into "keep".
			require.NoError(t, v.im(t).SnapshotRemove(ctx, v.engine, "old"))
			require.NoError(t, v.im(t).SnapshotPurge(ctx, v.engine))
			time.Sleep(delay)
			victim := nodes[1]
			require.NoError(t, victim.proc.Kill())
			victim.start(t)

			list, err := victim.client(t).InstanceList(ctx)
			require.NoError(t, err)
			var rname string
			for _, inst := range list {
				if inst.VolumeName == v.name {
					rname = inst.Name
					assert.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, inst.State, inst.Error)
					v.replicas[rname] = inst.Address
				}
			}
			require.NotEmpty(t, rname, "the killed node's replica is back")

			endpoint := crashEngine(t, nodes[0], v.name+"-check", v.name+"-check", map[string]string{rname: v.replicas[rname]})
			assert.Equal(t, sha256File(t, want), readVolume(t, endpoint), "the replica reads what the volume held")
			snaps, err := nodes[0].client(t).SnapshotList(ctx, v.name+"-check")
			require.NoError(t, err)
			assert.Contains(t, snaps, "keep")
			if old, ok := snaps["old"]; ok {
				t.Logf("killed before the purge finished: old is still there (removed=%v)", old.Removed)
			} else {
				t.Logf("killed after the purge finished")
			}
		})
	}
}
