package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
)

// qemuPipe is a qemu-io process fed one command at a time, each awaited.
type qemuPipe struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startQemuPipe(t *testing.T, endpoint string) *qemuPipe {
	t.Helper()
	path, err := exec.LookPath("qemu-io")
	require.NoError(t, err, "apt-get install qemu-utils")
	cmd := exec.Command(path, "-f", "raw", endpoint)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = w, w
	require.NoError(t, cmd.Start())
	w.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &qemuPipe{cmd: cmd, stdin: stdin, out: bufio.NewScanner(r)}
}

// write writes pattern at slot (4 KiB) and returns once qemu-io saw it
// acknowledged.
func (q *qemuPipe) write(pattern, slot int) error {
	if _, err := fmt.Fprintf(q.stdin, "write -P %d %d 4k\n", pattern, slot*4096); err != nil {
		return err
	}
	var seen []string
	for q.out.Scan() {
		line := q.out.Text() // after a prompt "qemu-io> " when not on a terminal
		seen = append(seen, line)
		switch {
		case strings.Contains(line, "wrote "):
			return nil
		case strings.Contains(line, "failed"):
			return fmt.Errorf("qemu-io: %s", line)
		}
	}
	return fmt.Errorf("qemu-io ended (%v): %s", q.out.Err(), strings.Join(seen, "\n"))
}

// cutPattern is the byte of write n: never 0, distinct from its neighbours.
func cutPattern(n int) int { return n%251 + 1 }

// seqPrefix is how many of writes 1, 2, ... an image holds in order: write
// n fills slot n with cutPattern(n).
func seqPrefix(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	n := 1
	for ; (n+1)*4096 <= len(data); n++ {
		if !bytes.Equal(data[n*4096:(n+1)*4096], bytes.Repeat([]byte{byte(cutPattern(n))}, 4096)) {
			break
		}
	}
	return n - 1
}

// The writer writes n to volume A, and once acknowledged, n to volume B,
// for n = 1, 2, ...: B is never ahead of A. Group cuts over the two engines,
// on two nodes, hold that in every cut; snapshots taken one after the
// other do not (which shows the check can fail).
func TestGroupCutIsCrashConsistentAcrossNodes(t *testing.T) {
	const cuts, plain = 20, 10
	nodes := threeNodes(t)
	ctx := context.Background()
	a := createVolume(t, "cuta", nodes)
	b := createVolume(t, "cutb", []*node{nodes[1], nodes[2], nodes[0]}) // its engine on node-2
	qa, qb := startQemuPipe(t, a.endpoint), startQemuPipe(t, b.endpoint)
	slots := volSize / 4096
	var rounds atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; n < slots && !stop.Load(); n++ {
			if !assert.NoError(t, qa.write(cutPattern(n), n)) || !assert.NoError(t, qb.write(cutPattern(n), n)) {
				return
			}
			rounds.Store(int64(n))
		}
	}()
	waitRounds := func(more int64) {
		t.Helper()
		from := rounds.Load()
		require.Eventually(t, func() bool { return rounds.Load() >= from+more }, time.Minute, time.Millisecond, "the writer goes on")
	}
	waitRounds(20)

	var stalls []time.Duration
	for i := range cuts {
		name := fmt.Sprintf("g%d", i)
		res, err := engineapi.TakeGroupCut(ctx, "cut-"+name, []engineapi.CutMember{
			{Client: a.im(t).DataPlane(), Engine: a.engine, Snapshot: name, UserCreated: true},
			{Client: b.im(t).DataPlane(), Engine: b.engine, Snapshot: name, UserCreated: true},
		}, 10*time.Second)
		require.NoError(t, err)
		stalls = append(stalls, res.Stall)
		waitRounds(5)
	}
	for i := range plain {
		name := fmt.Sprintf("p%d", i)
		_, err := a.im(t).SnapshotCreate(ctx, a.engine, name, true, nil, 0)
		require.NoError(t, err)
		waitRounds(3) // the writer goes on between the two snapshots
		_, err = b.im(t).SnapshotCreate(ctx, b.engine, name, true, nil, 0)
		require.NoError(t, err)
	}
	stop.Store(true)
	wg.Wait()
	require.Less(t, rounds.Load(), int64(slots-1), "the writer ran through every cut")

	for i := range cuts {
		name := fmt.Sprintf("g%d", i)
		na, nb := seqPrefix(t, exportTo(t, a, name)), seqPrefix(t, exportTo(t, b, name))
		assert.Contains(t, []int{nb, nb + 1}, na, "cut %s: A holds writes 1..%d, B 1..%d", name, na, nb)
	}
	violations := 0
	for i := range plain {
		name := fmt.Sprintf("p%d", i)
		if seqPrefix(t, exportTo(t, b, name)) > seqPrefix(t, exportTo(t, a, name)) {
			violations++
		}
	}
	slices.Sort(stalls)
	t.Logf("%d group cuts of 2 engines on 2 nodes (3 replicas each), %d writes per volume: all consistent; write stall p50 %v, max %v",
		cuts, rounds.Load(), stalls[len(stalls)/2], stalls[len(stalls)-1])
	t.Logf("snapshots one after the other: B ahead of A in %d of %d", violations, plain)
	assert.Positive(t, violations, "snapshots taken one after the other show B ahead of A")
}

// A group cut whose caller dies after the freeze (a manager killed
// mid-cut), and one whose member's instance manager is killed after the
// freeze: writes resume, and no volume keeps a snapshot of the cut.
func TestGroupCutKilledMidway(t *testing.T) {
	nodes := threeNodes(t)
	ctx := context.Background()
	// Nothing of A on node-2, whose instance manager is killed below: A's
	// snapshot is taken, then removed when B's fails.
	a := createVolume(t, "killa", []*node{nodes[0], nodes[2]})
	b := createVolume(t, "killb", []*node{nodes[1], nodes[2]})
	members := []engineapi.CutMember{
		{Client: a.im(t).DataPlane(), Engine: a.engine, Snapshot: "g", UserCreated: true},
		{Client: b.im(t).DataPlane(), Engine: b.engine, Snapshot: "g", UserCreated: true},
	}
	qa := startQemuPipe(t, a.endpoint)

	t.Run("the caller dies after the freeze", func(t *testing.T) {
		const timeout = 2 * time.Second
		dead := &engineapi.GroupCut{Name: "dead", Members: members, Timeout: timeout}
		require.NoError(t, dead.Freeze(ctx))
		start := time.Now()
		require.NoError(t, qa.write(cutPattern(1), 1), "a write during the freeze completes once it times out")
		waited := time.Since(start)
		t.Logf("a write issued during an abandoned freeze of %v completed after %v", timeout, waited)
		assert.Greater(t, waited, timeout/2, "the write waited for the freeze")
		err := dead.Snapshot(ctx)
		require.ErrorIs(t, err, engineapi.ErrFreezeLost, "a late snapshot is refused")
		_, err = dead.Finish(err)
		require.Error(t, err)
		// Both freezes lapse about together: the later one may still hold
		// when the snapshots are asked for, and that member takes its
		// snapshot; Finish then removes it (all or nothing).
		for _, v := range []*volume{a, b} {
			snaps, err := v.im(t).SnapshotList(ctx, v.engine)
			require.NoError(t, err)
			assert.True(t, snaps["g"] == nil || snaps["g"].Removed, "%s keeps nothing of the cut", v.name)
		}
	})

	t.Run("a member's instance manager is killed after the freeze", func(t *testing.T) {
		cut := &engineapi.GroupCut{Name: "kill", Members: members, Timeout: 30 * time.Second}
		require.NoError(t, cut.Freeze(ctx))
		require.NoError(t, nodes[1].proc.Kill(), "kill -9 the instance manager of B's engine")
		err := cut.Snapshot(ctx)
		require.Error(t, err, "B's snapshot cannot be taken")
		res, err := cut.Finish(err)
		require.Error(t, err)
		t.Logf("the cut failed after %v: %v", res.Stall, err)
		snaps, err := a.im(t).SnapshotList(ctx, a.engine)
		require.NoError(t, err)
		require.Contains(t, snaps, "g", "A's snapshot was taken")
		assert.True(t, snaps["g"].Removed, "and removed when the cut failed")
		require.NoError(t, qa.write(cutPattern(2), 2), "A takes writes again")

		nodes[1].start(t)
		list, err := nodes[1].client(t).InstanceList(ctx)
		require.NoError(t, err)
		reopened := map[string]string{}
		for _, inst := range list {
			if inst.VolumeName == "killb" {
				reopened[inst.Name] = inst.Address
			}
		}
		require.Len(t, reopened, 1, "B's replica on the killed node reopens")
		require.NotEmpty(t, crashEngine(t, nodes[1], "killb-check", "killb-check", reopened))
		bSnaps, err := nodes[1].client(t).SnapshotList(ctx, "killb-check")
		require.NoError(t, err)
		// A "g" removed by the first subtest's Finish may wait for a purge.
		assert.True(t, bSnaps["g"] == nil || bSnaps["g"].Removed, "B's replica has no live snapshot of the cut")
	})
}

// TestGroupCutStall measures how long a group cut of 8 volumes, their
// engines spread over 3 nodes, stalls writes (first freeze to last thaw),
// against a plain snapshot of one volume (which also holds writes while it
// runs) measured in the same run.
func TestGroupCutStall(t *testing.T) {
	const volumes, rounds = 8, 20
	nodes := threeNodes(t)
	ctx := context.Background()
	var members []engineapi.CutMember
	var vols []*volume
	for i := range volumes {
		order := []*node{nodes[i%3], nodes[(i+1)%3], nodes[(i+2)%3]}
		v := createVolume(t, fmt.Sprintf("stall%d", i), order)
		vols = append(vols, v)
		members = append(members, engineapi.CutMember{Client: v.im(t).DataPlane(), Engine: v.engine})
	}
	var cut, plain []time.Duration
	for r := range rounds {
		for i := range members {
			members[i].Snapshot = fmt.Sprintf("g%d", r)
		}
		res, err := engineapi.TakeGroupCut(ctx, fmt.Sprintf("stall-%d", r), members, 10*time.Second)
		require.NoError(t, err)
		cut = append(cut, res.Stall)
		start := time.Now()
		_, err = vols[0].im(t).SnapshotCreate(ctx, vols[0].engine, fmt.Sprintf("p%d", r), true, nil, 0)
		require.NoError(t, err)
		plain = append(plain, time.Since(start))
	}
	pct := func(d []time.Duration, p int) time.Duration {
		slices.Sort(d)
		return d[(len(d)-1)*p/100]
	}
	t.Logf("write stall of a group cut, %d volumes on 3 nodes (3 replicas each), %d cuts: p50 %v, p99 %v; "+
		"baseline, one volume's plain snapshot: p50 %v, p99 %v",
		volumes, rounds, pct(cut, 50), pct(cut, 99), pct(plain, 50), pct(plain, 99))
}
