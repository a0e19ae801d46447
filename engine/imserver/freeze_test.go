package imserver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
)

// A freeze through the API: a snapshot outside it is refused at once, one
// in another cut is refused as lost, a thaw of an unknown engine names it,
// and deleting a frozen engine does not wait out the freeze.
func TestEngineFreezeAPI(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 4*mib)
	_, err := im.c.InstanceCreate(ctx, engineReq("e", 4*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)

	require.NoError(t, im.c.EngineFreeze(ctx, "e", "c1", time.Minute, 0))
	_, err = im.c.SnapshotCreate(ctx, "e", "plain", true, nil, 0)
	assert.ErrorIs(t, err, engineapi.ErrBusy, "a snapshot outside the cut")
	assert.ErrorIs(t, im.c.SnapshotCreateInCut(ctx, "e", "c2", "s", true, nil), engineapi.ErrFreezeLost)
	assert.ErrorIs(t, im.c.EngineFreeze(ctx, "e", "c2", time.Minute, 0), engineapi.ErrBusy, "another cut")
	require.NoError(t, im.c.SnapshotCreateInCut(ctx, "e", "c1", "s", true, nil))
	require.NoError(t, im.c.EngineThaw(ctx, "e", "c1"))
	require.NoError(t, im.c.EngineThaw(ctx, "e", "c1"), "a thaw is idempotent")
	snaps, err := im.c.SnapshotList(ctx, "e")
	require.NoError(t, err)
	assert.Contains(t, snaps, "s")
	assert.ErrorIs(t, im.c.EngineThaw(ctx, "nope", "c1"), engineapi.ErrNotFound)

	require.NoError(t, im.c.EngineFreeze(ctx, "e", "c3", time.Minute, 0))
	start := time.Now()
	_, err = im.c.InstanceDelete(ctx, "e")
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 30*time.Second, "the delete thawed the engine instead of waiting a minute")
}
