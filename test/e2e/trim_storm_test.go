package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/devtools/fsalloc"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	stypes "github.com/strata-storage/strata/types"
)

// A trim storm racing a snapshot, a snapshot's delete (its purge frees
// trimmed blocks) and a rebuild: a replica's instance manager is killed
// with SIGKILL in the middle of it and started again. No acknowledged
// write is lost, write-zeroes read as zeros, and the kept snapshot still
// holds what it held (checked through a clone of it).
//
// The 64 MiB volume: the kept snapshot holds [48M, 64M), the deleted one
// [0, 48M) over nothing, so its purge frees what the storm trims there:
// [0, 16M) gets trims, [16M, 32M) write-zeroes, [32M, 48M) writes of a new
// pattern each round; [48M, 64M) is left alone.
func TestTrimStormSurvivesAKilledInstanceManager(t *testing.T) {
	defer setSetting(t, stypes.SettingReplicaReplenishmentWaitInterval, "1")()
	const vol = "e2e-trimstorm"
	createVolume(t, vol, "64Mi", 3)
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	holders := holdersOf(t, vol)
	require.Len(t, holders, 3)
	attachNode, victim := holders[0], holders[1]
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, attachNode))
	ep := waitVolume(t, vol, time.Minute, "attached", attachedTo(attachNode)).Status.FrontendEndpoint
	qemuIO(t, ep, "write -P 0x11 48M 16M")
	createSnapshot(t, vol, "e2e-ts-kept")
	waitSnapshotsReady(t, vol, 1, time.Minute)
	qemuIO(t, ep, "write -P 0x22 0 48M")
	createSnapshot(t, vol, "e2e-ts-gone")
	waitSnapshotsReady(t, vol, 2, time.Minute)

	var (
		mu     sync.Mutex
		acked  = map[int]int{} // MiB of [32M, 48M) → pattern of its last acknowledged write
		rounds int
		stop   = make(chan struct{})
		done   = make(chan struct{})
	)
	wrote := regexp.MustCompile(`wrote 1048576/1048576 bytes at offset (\d+)`)
	go func() {
		defer close(done)
		for round := 0; ; round++ {
			select {
			case <-stop:
				return
			default:
			}
			pattern := 0x30 + round%64
			var cmds []string
			for i := range 4 {
				mib := (round*4 + i) % 16
				cmds = append(cmds, fmt.Sprintf("discard %dM 1M", mib), fmt.Sprintf("write -z %dM 1M", 16+mib),
					fmt.Sprintf("write -P %#x %dM 1M", pattern, 32+mib))
			}
			out, _ := runQemuIO(ep, cmds...) // a failed command is one not acknowledged
			mu.Lock()
			for _, m := range wrote.FindAllStringSubmatch(out, -1) {
				off, _ := strconv.Atoi(m[1])
				if off >= 32<<20 {
					acked[off>>20-32] = pattern
				}
			}
			rounds++
			mu.Unlock()
		}
	}()
	waitRounds := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return rounds >= n
		}, 2*time.Minute, 50*time.Millisecond, "%d rounds of the storm", n)
	}

	waitRounds(5) // every MiB of each region trimmed, zeroed or written once
	deleteSnapshotCR(t, "e2e-ts-gone")
	// Its purge frees what the storm trimmed, zeroed or overwrote: all of
	// it, so the emptied layer leaves the chain.
	require.Eventually(t, func() bool {
		_, still := engineChain(t, vol)["e2e-ts-gone"]
		return !still
	}, time.Minute, 100*time.Millisecond, "e2e-ts-gone purged away during the storm")
	t.Logf("e2e-ts-gone purged away during the storm; replicas %v", mibOf(replicaBytes(t, vol)))
	createSnapshot(t, vol, "e2e-ts-mid")
	waitRounds(rounds + 3)
	restart := killIM(t, victim)
	t.Logf("killed im-%s in the middle of the storm", victim)
	waitVolume(t, vol, time.Minute, "degraded: the engine lost the replica", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessDegraded
	})
	waitRounds(10)
	restart()
	waitVolume(t, vol, 3*time.Minute, "healthy again (the replica on "+victim+" rebuilt)", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy && len(holdersOf(t, vol)) == 3
	})
	mu.Lock()
	after := rounds + 3
	mu.Unlock()
	waitRounds(after)
	close(stop)
	<-done

	v := getVolume(t, vol)
	t.Logf("after the storm: chain %v; head %d, snapshots %d, removed %d bytes; replicas %v", describeChain(t, vol),
		v.Status.HeadSize, v.Status.SnapshotsSize, v.Status.RemovedSnapshotsSize, mibOf(replicaBytes(t, vol)))
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d rounds of 4 trims, 4 write-zeroes and 4 writes; %d MiB of writes acknowledged", rounds, len(acked))
	reads := []string{"read -P 0 16M 16M", "read -P 0x11 48M 16M"}
	for mib := range 16 {
		if p, ok := acked[mib]; ok {
			reads = append(reads, fmt.Sprintf("read -P %#x %dM 1M", p, 32+mib))
		}
	}
	for range 3 { // reads go to every replica in turn
		qemuIO(t, ep, reads...)
	}

	createVolume(t, "e2e-ts-clone", "64Mi", 1, func(v *v1beta1.Volume) { v.Spec.DataSource = "snap://" + vol + "/e2e-ts-kept" })
	waitVolume(t, "e2e-ts-clone", 2*time.Minute, "clone completed", func(v *v1beta1.Volume) bool {
		cs := v.Status.CloneStatus
		if cs == nil {
			return false
		}
		require.NotEqual(t, v1beta1.VolumeCloneStateFailed, cs.State, "clone failed: %s", cs.Message)
		return cs.State == v1beta1.VolumeCloneStateCompleted && isDetached(v)
	})
	useOn(t, "e2e-ts-clone", attachNode, "read -P 0 0 48M", "read -P 0x11 48M 16M")
}

// describeChain names each snapshot of the engine's chain with its size
// and whether it is removed.
func describeChain(t *testing.T, volume string) []string {
	var out []string
	for name, s := range engineChain(t, volume) {
		if s != nil && name != stypes.VolumeHeadName {
			out = append(out, fmt.Sprintf("%s(%d, removed %v)", name, s.Size, s.Removed))
		}
	}
	slices.Sort(out)
	return out
}

// replicaBytes is what each replica of the volume holds on its disk: the
// allocated bytes (st_blocks) of every file in its data directory.
func replicaBytes(t *testing.T, volume string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, r := range replicasOf(t, volume) {
		for _, n := range fileBytes(t, replicaDataDir(r)) {
			out[r.Name] += n
		}
	}
	return out
}

// fileBytes is the allocated bytes (st_blocks) of each file in dir.
func fileBytes(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out, err := fsalloc.Files(dir)
	require.NoError(t, err)
	return out
}

func mibOf(m map[string]int64) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k[strings.LastIndex(k, "-")+1:]] = fmt.Sprintf("%.2fMiB", float64(v)/(1<<20))
	}
	return out
}

func deleteSnapshotCR(t *testing.T, name string) {
	t.Helper()
	require.NoError(t, env.adminStrata.StrataV1beta1().Snapshots(ns).Delete(context.Background(), name, metav1.DeleteOptions{}))
}
