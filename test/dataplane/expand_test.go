package dataplane

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
)

// Offline expansion grows every replica; data written before stays, and
// the new space reads zeros and takes writes.
func TestVolumeExpandOffline(t *testing.T) {
	v := createVolume(t, "grow", threeNodes(t))
	ctx := context.Background()
	qemuIO(t, v.endpoint, "write -P 0x61 0 1M", "write -P 0x62 63M 1M")
	v.snapshot(t, "small")

	_, err := v.im(t).FrontendStop(ctx, v.engine)
	require.NoError(t, err)
	assert.ErrorIs(t, v.im(t).VolumeExpand(ctx, v.engine, 2*volSize+1), engineapi.ErrInvalid, "size must be block-aligned")
	require.NoError(t, v.im(t).VolumeExpand(ctx, v.engine, 2*volSize))
	inst, err := v.im(t).FrontendStart(ctx, v.engine, "nbd")
	require.NoError(t, err)
	assert.EqualValues(t, 2*volSize, inst.Size)

	size := strings.TrimSpace(tool(t, "nbdinfo", "--size", inst.FrontendEndpoint))
	assert.Equal(t, strconv.Itoa(2*volSize), size, "clients see the new size")
	out := qemuIO(t, inst.FrontendEndpoint,
		"read -P 0x61 0 1M", "read -P 0x62 63M 1M", "read -P 0 64M 64M", "write -P 0x63 100M 1M", "read -P 0x63 100M 1M")
	assert.NotContains(t, out, "verification failed")
}

// Online expansion grows the engine and every replica while a client keeps
// writing: no write fails, the data stays, new connections see the new
// size, and the growable export serves the new range to a client that was
// connected before.
func TestVolumeExpandOnline(t *testing.T) {
	v := createVolume(t, "grow-online", threeNodes(t))
	ctx := context.Background()
	qemuIO(t, v.endpoint, "write -P 0x61 0 1M")
	ep, err := engineapi.ParseNBDEndpoint(v.endpoint)
	require.NoError(t, err)
	growable := ep.WithExport(ep.Export + engineapi.GrowableExportSuffix).String()
	assert.Equal(t, strconv.Itoa(engineapi.MaxVolumeSize), strings.TrimSpace(tool(t, "nbdinfo", "--size", growable)),
		"the growable export advertises the ceiling")

	var writes atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // a writer that keeps going through the expansion
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if out, err := runQemuIO(v.endpoint, fmt.Sprintf("write -P 0x%02x 8M 4M", 0x10+i%16)); err != nil || strings.Contains(out, "failed") {
				done <- fmt.Errorf("write %d during the expansion: %v: %s", i, err, out)
				return
			}
			writes.Add(1)
		}
	}()
	waitWrites := func(n int64) {
		require.Eventually(t, func() bool { return writes.Load() >= n || len(done) > 0 }, time.Minute, 10*time.Millisecond)
	}
	waitWrites(2)
	require.NoError(t, v.im(t).VolumeExpand(ctx, v.engine, 2*volSize), "expansion while the frontend serves")
	waitWrites(writes.Load() + 2)
	close(stop)
	require.NoError(t, <-done, "no write failed")

	inst, err := v.im(t).InstanceGet(ctx, v.engine)
	require.NoError(t, err)
	assert.EqualValues(t, 2*volSize, inst.Size)
	assert.Equal(t, strconv.Itoa(2*volSize), strings.TrimSpace(tool(t, "nbdinfo", "--size", v.endpoint)), "new clients see the new size")
	out := qemuIO(t, v.endpoint, "read -P 0x61 0 1M", "read -P 0 64M 64M", "write -P 0x63 100M 1M", "read -P 0x63 100M 1M")
	assert.NotContains(t, out, "verification failed")
	out = qemuIO(t, growable, "read -P 0x63 100M 1M", "read -P 0x61 0 1M")
	assert.NotContains(t, out, "verification failed", "the growable export serves the grown volume")
	out, err = runQemuIO(growable, "read 200M 4k")
	assert.True(t, err != nil || strings.Contains(out, "error"), "nothing is served beyond the volume: %s", out)
}

// runQemuIO is qemuIO for a goroutine or an expected failure: no t.
func runQemuIO(target string, cmds ...string) (string, error) {
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.Command("qemu-io", append(args, target)...).CombinedOutput()
	return string(out), err
}
