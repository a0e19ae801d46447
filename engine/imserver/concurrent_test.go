package imserver

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi/impb"
)

// Many replicas created at once (a burst of volumes attaching) all start,
// and the saved spec file lists every one: saves are serialized, and a
// failed save cannot crash the data connection server it stops.
func TestConcurrentReplicaCreates(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	const n = 64
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Go(func() {
			_, errs[i] = im.c.InstanceCreate(ctx, &impb.InstanceCreateRequest{Name: fmt.Sprintf("r-%02d", i),
				Type: impb.InstanceType_INSTANCE_TYPE_REPLICA, VolumeName: fmt.Sprintf("v-%02d", i), Size: mib,
				DataDir: filepath.Join(im.diskDir, fmt.Sprintf("r-%02d", i))})
		})
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "replica %d", i)
	}
	specs, err := loadSpecs(im.opts.StateDir)
	require.NoError(t, err)
	assert.Len(t, specs, n, "every replica is recorded for a restart")
	list, err := im.c.InstanceList(ctx)
	require.NoError(t, err)
	assert.Len(t, list, n)
}
