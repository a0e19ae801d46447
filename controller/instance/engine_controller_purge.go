package instance

import (
	"context"
	"errors"
	"fmt"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// purgeFreeableAt is how much removed snapshots must hold that a purge
// would free before the engine controller purges on its own. A removed
// snapshot under the live head keeps gaining such bytes after its delete's
// purge: the head overwrites its blocks, the user trims them. Without this
// they would wait for the next snapshot's delete; with a threshold, a
// volume writing over it is not purged at every size report.
const purgeFreeableAt = 16 << 20

// purgeFreeable starts a purge of a running engine whose removed
// snapshots hold purgeFreeableAt or more that a purge frees, unless one
// runs or purge is disabled (the volume's SnapshotSpaceRetained condition
// says so then). A busy engine (a rebuild) is left for a later event.
func (c *EngineController) purgeFreeable(ctx context.Context, client engineapi.DataPlane, e *v1beta1.Engine) error {
	freeable, _ := e.Status.RemovedExclusive()
	if freeable < purgeFreeableAt || kit.IsPurging(e) {
		return nil
	}
	if noPurge, _ := c.DS.GetSettingBool(types.SettingDisableSnapshotPurge); noPurge {
		return nil
	}
	err := client.SnapshotPurge(ctx, e.Name)
	switch {
	case errors.Is(err, engineapi.ErrBusy):
		return nil
	case err != nil:
		return fmt.Errorf("purging engine %s (removed snapshots hold %d bytes a purge frees): %w", e.Name, freeable, err)
	}
	c.Logger.WithFields(map[string]any{"engine": e.Name, "volume": e.Spec.VolumeName, "bytes": freeable}).
		Info("Purging: removed snapshots hold data a purge frees")
	return nil
}
