// Package benchvol creates volumes on running instance managers for the
// benchmarks under scripts/ (bench, bench-backup): what a manager would
// ask for, without a control plane.
package benchvol

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// EngineName is the name of the engine instance Create makes for volume.
func EngineName(volume string) string { return volume + "-e" }

// Create makes one replica of volume name per instance manager (data in
// dir/<name>-r<N>) and its engine on the first, serving frontend ("nbd",
// or "" for none). It returns the engine instance; with a frontend its
// FrontendEndpoint is the NBD URI.
func Create(ctx context.Context, clients []*engineapi.Client, name string, size int64, dir, frontend string) (*impb.Instance, error) {
	if name == "" || size <= 0 || !filepath.IsAbs(dir) || len(clients) == 0 {
		return nil, errors.New("create volume: needs a name, a size, an absolute directory and an instance manager")
	}
	replicas := map[string]string{}
	for i, c := range clients {
		rname := fmt.Sprintf("%s-r%d", name, i+1)
		inst, err := c.InstanceCreate(ctx, &impb.InstanceCreateRequest{Name: rname, Type: impb.InstanceType_INSTANCE_TYPE_REPLICA,
			VolumeName: name, Size: size, DataDir: filepath.Join(dir, rname)})
		if err != nil {
			return nil, fmt.Errorf("replica %s on %s: %w", rname, c.Address(), err)
		}
		replicas[rname] = inst.Address
	}
	inst, err := clients[0].InstanceCreate(ctx, &impb.InstanceCreateRequest{Name: EngineName(name), Type: impb.InstanceType_INSTANCE_TYPE_ENGINE,
		VolumeName: name, Size: size, Replicas: replicas, Frontend: frontend})
	if err != nil {
		return nil, fmt.Errorf("engine of %s: %w", name, err)
	}
	if len(inst.ReplicaModes) != len(replicas) {
		return nil, fmt.Errorf("engine of %s has %d replicas, want %d: %s", name, len(inst.ReplicaModes), len(replicas), inst.Error)
	}
	return inst, nil
}
