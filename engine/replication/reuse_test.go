package replication

import (
	"context"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/replicactl"
)

// recording wraps a backend and records the layers whose extents it is
// asked for: on the source, the layers a rebuild copies.
type recording struct {
	Backend
	mu     sync.Mutex
	layers []string
}

func (r *recording) Control(ctx context.Context, method string, args, reply any) error {
	if a, ok := args.(replicactl.NameArgs); ok && method == replicactl.Extents {
		r.mu.Lock()
		r.layers = append(r.layers, a.Name)
		r.mu.Unlock()
	}
	return r.Backend.Control(ctx, method, args, reply)
}

// A replica that left the engine (failed) and comes back is rebuilt by
// copying only what it lacks: layers with the name and ID it has are kept,
// a layer the healthy replicas coalesced since is copied, and it ends with
// their chain, reading like them alone. A new replica rebuilt afterwards
// copies everything, for comparison.
func TestRebuildReusesReturningReplica(t *testing.T) {
	const size = 16 << 20
	const mib = 1 << 20
	cases := []struct {
		name         string
		purgeS1      bool
		copied, kept []string
	}{
		{name: "writes and a snapshot since", copied: []string{"s3"}, kept: []string{"s1", "s2"}},
		{name: "s1 removed and purged meanwhile", purgeS1: true, copied: []string{"s2", "s3"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := New("vol", size, quietLog(), nil)
			var reps []*servedReplica
			for _, name := range []string{"r1", "r2", "r3"} {
				r := serveReplica(t, name, size)
				reps = append(reps, r)
				require.NoError(t, e.AddReplica(r.name, r.addr, dialT(t, r.addr), ModeRW))
			}
			m := newVolumeModel(size)
			rng := rand.New(rand.NewSource(3))
			write := func(off, length int64) {
				p := make([]byte, length)
				rng.Read(p)
				_, err := e.WriteAt(p, off)
				require.NoError(t, err)
				_, _ = m.mem.WriteAt(p, off)
			}
			write(0, 6*mib) // A
			require.NoError(t, e.Snapshot(ctx, "s1", SnapshotOptions{UserCreated: true}))
			write(4*mib, 6*mib) // B
			require.NoError(t, e.WriteZeroes(mib, 64<<10))
			_ = m.mem.WriteZeroes(mib, 64<<10)
			require.NoError(t, e.Snapshot(ctx, "s2", SnapshotOptions{UserCreated: true}))
			write(12*mib, 100<<10)

			// r3 fails: it leaves the engine and misses what follows.
			require.NoError(t, e.RemoveReplica("r3"))
			write(14*mib, 256<<10) // C
			write(3*mib+100, 5000)
			require.NoError(t, e.Snapshot(ctx, "s3", SnapshotOptions{UserCreated: true}))
			write(15*mib, 128<<10)
			if tc.purgeS1 {
				require.NoError(t, e.RemoveSnapshot(ctx, "s1"))
				require.NoError(t, e.StartPurge(ctx))
				require.Eventually(t, func() bool {
					for _, st := range e.PurgeStatus(ctx) {
						if st.IsPurging {
							return false
						}
					}
					return true
				}, 10*time.Second, 10*time.Millisecond)
			}

			// It comes back and is rebuilt under writes.
			src := &recording{}
			w := startWriters(e, m, 1, 9)
			err := e.Rebuild(ctx, RebuildOptions{Replica: "r3", Address: reps[2].addr, Target: dialT(t, reps[2].addr),
				Source: "r1", Dial: func(ctx context.Context, addr string) (Backend, error) {
					b, err := dialBackend(ctx, addr)
					if err != nil || addr != reps[0].addr {
						return b, err
					}
					src.Backend = b
					return src, nil
				}})
			w.waitMore(t, 10)
			w.halt(t)
			require.NoError(t, err)
			st := e.RebuildStatus()["r3"]
			rebuildSnap := ""
			for _, name := range src.layers {
				if name != "s1" && name != "s2" && name != "s3" {
					rebuildSnap = name
				}
			}
			require.NotEmpty(t, rebuildSnap, "the rebuild snapshot is copied")
			assert.ElementsMatch(t, append(slices.Clone(tc.copied), rebuildSnap), src.layers, "layers copied")
			assert.Equal(t, len(tc.kept), st.KeptLayers)
			assert.Equal(t, len(tc.copied)+1, st.CopiedLayers)
			assert.Equal(t, RebuildComplete, st.State)

			rb, _, _ := e.Backend("r3")
			sb, _, _ := e.Backend("r1")
			require.Equal(t, chainOf(t, sb), chainOf(t, rb), "the returning replica has the volume's chain")
			if tc.purgeS1 {
				assert.NotContains(t, chainOf(t, rb), "s1", "its own s1 is gone")
			}

			// A new replica copies everything.
			fresh := serveReplica(t, "r4", size)
			require.NoError(t, e.Rebuild(ctx, RebuildOptions{Replica: fresh.name, Address: fresh.addr,
				Target: dialT(t, fresh.addr), Dial: dialBackend}))
			full := e.RebuildStatus()["r4"]
			assert.Zero(t, full.KeptLayers)
			t.Logf("returning replica: copied %d bytes (%d layers), kept %d bytes (%d layers); new replica: copied %d bytes",
				st.CopiedBytes, st.CopiedLayers, st.KeptBytes, st.KeptLayers, full.CopiedBytes)
			if len(tc.kept) > 0 {
				assert.Less(t, st.CopiedBytes, full.CopiedBytes/4, "far less is copied into the returning replica")
				assert.GreaterOrEqual(t, st.KeptBytes, int64(10*mib), "s1 and s2 are kept")
			} else {
				assert.Greater(t, st.CopiedBytes, int64(10*mib), "the coalesced s2 is copied whole")
			}

			// Alone, the returning replica reads every write.
			for _, name := range []string{"r1", "r2", "r4"} {
				require.NoError(t, e.RemoveReplica(name))
			}
			m.check(t, readDevice(t, e), "the returning replica alone")
		})
	}
}
