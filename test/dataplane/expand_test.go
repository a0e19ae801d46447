package dataplane

import (
	"context"
	"strconv"
	"strings"
	"testing"

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

	assert.ErrorIs(t, v.im(t).VolumeExpand(ctx, v.engine, 2*volSize), engineapi.ErrBusy, "expansion is offline")
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
