package dataplane

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
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
//
// qemu-io reads its commands from a pipe and is kept a few writes ahead of
// the acknowledgements read back, so the kill lands once killAfter writes
// are acknowledged, while later ones are queued or in flight, and before
// the stream could have ended; no clock decides when.
func TestInstanceManagerKilledDuringWrites(t *testing.T) {
	const window, killAfter = 4, 32
	nodes := threeNodes(t)
	v := createVolume(t, "crashw", nodes)
	v.snapshot(t, "before")

	slots := volSize / crashChunk
	q := startQemuPipe(t, v.endpoint)
	stdin := q.stdin

	sent := 0
	send := func() {
		_, err := fmt.Fprintf(stdin, "write -P %d %d %d\n", crashPattern(sent), sent*crashChunk, crashChunk)
		require.NoError(t, err)
		sent++
	}
	for range window {
		send()
	}
	var acked []int
	var transcript []string
	killed := false
	lines := q.out
	for lines.Scan() { // ends when qemu-io exits: stdin closed, its server gone
		transcript = append(transcript, lines.Text())
		m := wroteRE.FindStringSubmatch(lines.Text())
		if m == nil {
			continue
		}
		off, _ := strconv.Atoi(m[1])
		acked = append(acked, off/crashChunk)
		switch {
		case killed:
		case len(acked) == killAfter:
			require.NoError(t, nodes[0].proc.Kill(), "kill -9 the engine's instance manager")
			killed = true
			require.NoError(t, stdin.Close())
		default:
			send()
		}
	}
	require.NoError(t, lines.Err())
	_ = q.cmd.Wait() // fails once its server is gone
	require.True(t, killed, "only %d writes acknowledged before qemu-io ended:\n%s", len(acked),
		strings.Join(transcript, "\n"))
	t.Logf("%d of %d writes acknowledged, %d sent, when the kill took effect", len(acked), slots, sent)

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
// snapshot, at several moments told by the purge itself: as soon as it has
// started, once the victim's replica reports progress, and once it reports
// it complete. The replica always reopens and reads what the volume held,
// and its remaining snapshot is intact.
func TestInstanceManagerKilledDuringPurge(t *testing.T) {
	nodes := threeNodes(t)
	moments := []struct {
		name    string
		reached func(*impb.PurgeStatus) bool // nil: at once
		// midPurge: the kill must land while the purge runs, so the
		// chain still holds the removed snapshot afterwards.
		midPurge bool
	}{
		{"started", nil, true},
		{"progressing", func(p *impb.PurgeStatus) bool {
			// The 40 MiB coalesce reports progress as it copies (seen at
			// 66%): a poll that finds it already complete is a lost race
			// below, never a pass without a kill mid-purge.
			return (p.GetIsPurging() && p.GetProgress() > 0) || purgeComplete(p)
		}, true},
		{"complete", purgeComplete, false},
	}
	for round, moment := range moments {
		t.Run(moment.name, func(t *testing.T) {
			// A kill meant for the middle of the purge can land just after
			// its last chunk (seen at 99 % on a loaded machine): that
			// attempt still checks the data, and the next one tries again;
			// three lost races fail the test.
			for attempt := range lostRaces {
				if !purgeKillAttempt(t, nodes, fmt.Sprintf("crashp%d-%d", round, attempt), moment.reached, moment.midPurge) {
					return
				}
				t.Logf("attempt %d: the kill landed after the purge finished; again", attempt)
			}
			t.Fatalf("the kill never landed while the purge ran in %d attempts", lostRaces)
		})
	}
}

// victimPurge is the purge status of v's replica on the second node, the
// one TestInstanceManagerKilledDuringPurge kills.
func victimPurge(t *testing.T, v *volume) *impb.PurgeStatus {
	st, err := v.im(t).SnapshotPurgeStatus(context.Background(), v.engine)
	if err != nil {
		t.Logf("purge status: %v", err)
	}
	return st[v.name+"-r2"]
}

func purgeComplete(p *impb.PurgeStatus) bool { return !p.GetIsPurging() && p.GetState() == "complete" }

// lostRaces is how many times a kill meant for the middle of a purge may
// land after it before TestInstanceManagerKilledDuringPurge fails.
const lostRaces = 3

// purgeKillAttempt is one round of TestInstanceManagerKilledDuringPurge on
// a new volume named name; it reports whether a kill meant for the middle
// of the purge landed after it (the data is checked whenever it killed).
func purgeKillAttempt(t *testing.T, nodes []*node, name string, reached func(*impb.PurgeStatus) bool, midPurge bool) (lostRace bool) {
	ctx := context.Background()
	v := createVolume(t, name, nodes)
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
	if reached != nil {
		require.Eventually(t, func() bool { return reached(victimPurge(t, v)) },
			time.Minute, time.Millisecond, "the victim's purge")
		last := victimPurge(t, v)
		t.Logf("killing at purge progress %d%% (%s)", last.GetProgress(), last.GetState())
		if midPurge && purgeComplete(last) {
			return true // the purge finished before a poll saw it in progress
		}
	}
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
	old, kept := snaps["old"]
	if midPurge {
		if !kept {
			return true
		}
		assert.True(t, old.Removed, "and still marked removed")
	} else {
		assert.False(t, kept, "the purge had finished: old is gone")
	}
	return false
}
