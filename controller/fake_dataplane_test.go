package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/strata-storage/strata/engineapi"
)

// fakeDataPlane is a small in-memory instance manager for controller
// tables: it records the calls that act (create, delete, snapshot, purge,
// ...) as "Method arg arg" and fails a method with the error a case injects.
// The end-to-end and integration tests use the real instance manager.
type fakeDataPlane struct {
	address string

	mu    sync.Mutex
	calls []string
	fail  map[string]error // method name -> error it returns
}

// fakeConnector serves the fakeDataPlane of each address it is asked for,
// creating it on first use.
type fakeConnector struct {
	mu    sync.Mutex
	fail  map[string]error
	by    map[string]*fakeDataPlane
	order []string
}

func NewFakeConnector(fail map[string]error) *fakeConnector {
	return &fakeConnector{fail: fail, by: map[string]*fakeDataPlane{}}
}

func (f *fakeConnector) DataPlane(address string) (engineapi.DataPlane, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dp, ok := f.by[address]
	if !ok {
		dp = &fakeDataPlane{address: address, fail: f.fail}
		f.by[address] = dp
		f.order = append(f.order, address)
	}
	return dp, nil
}

// calls lists every call made, address by address in first-use order.
func (f *fakeConnector) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, a := range f.order {
		dp := f.by[a]
		dp.mu.Lock()
		out = append(out, dp.calls...)
		dp.mu.Unlock()
	}
	return out
}

// record notes a call and returns the error injected for its method.
func (d *fakeDataPlane) record(method string, args ...string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, strings.Join(append([]string{method}, args...), " "))
	return d.fail[method]
}

func (d *fakeDataPlane) Address() string { return d.address }

func (d *fakeDataPlane) InstanceCreate(_ context.Context, spec engineapi.InstanceSpec) (*engineapi.Instance, error) {
	if err := d.record("InstanceCreate", spec.Name); err != nil {
		return nil, err
	}
	return &engineapi.Instance{Name: spec.Name, Type: spec.Type, VolumeName: spec.VolumeName, Size: spec.Size,
		State: engineapi.InstanceStateStarting}, nil
}

func (d *fakeDataPlane) InstanceDelete(_ context.Context, name string) error {
	return d.record("InstanceDelete", name)
}

// Watch is not what controller tables drive: the InstanceManager
// controller's stream is tested against the real instance manager.
func (d *fakeDataPlane) Watch(context.Context) (func() (*engineapi.WatchEvent, error), error) {
	return nil, fmt.Errorf("fake data plane has no Watch: %w", engineapi.ErrUnavailable)
}

func (d *fakeDataPlane) SnapshotCreate(_ context.Context, engine, name string, userCreated bool, _ map[string]string, _ time.Duration) (string, error) {
	return name, d.record("SnapshotCreate", engine, name, fmt.Sprint(userCreated))
}

func (d *fakeDataPlane) EngineFreeze(_ context.Context, engine, cut string, _, _ time.Duration) error {
	return d.record("EngineFreeze", engine, cut)
}

func (d *fakeDataPlane) EngineThaw(_ context.Context, engine, cut string) error {
	return d.record("EngineThaw", engine, cut)
}

func (d *fakeDataPlane) SnapshotCreateInCut(_ context.Context, engine, cut, name string, userCreated bool, _ map[string]string) error {
	return d.record("SnapshotCreateInCut", engine, cut, name, fmt.Sprint(userCreated))
}

func (d *fakeDataPlane) SnapshotList(_ context.Context, engine string) (map[string]*engineapi.Snapshot, error) {
	return nil, d.record("SnapshotList", engine)
}

func (d *fakeDataPlane) SnapshotRemove(_ context.Context, engine string, names ...string) error {
	return d.record("SnapshotRemove", append([]string{engine}, slices.Clone(names)...)...)
}

func (d *fakeDataPlane) SnapshotPurge(_ context.Context, engine string) error {
	return d.record("SnapshotPurge", engine)
}

func (d *fakeDataPlane) SnapshotPurgeStatus(_ context.Context, engine string) (map[string]*engineapi.PurgeStatus, error) {
	return nil, d.record("SnapshotPurgeStatus", engine)
}

func (d *fakeDataPlane) SnapshotRevert(_ context.Context, engine, name string) error {
	return d.record("SnapshotRevert", engine, name)
}

func (d *fakeDataPlane) SnapshotExport(_ context.Context, engine, snapshot string, _ func(engineapi.ExportChunk) error) error {
	return d.record("SnapshotExport", engine, snapshot)
}

func (d *fakeDataPlane) SnapshotBlocks(_ context.Context, args engineapi.SnapshotBlocksArgs,
	_ func(int64, []engineapi.BlockExtent) error) error {
	return d.record("SnapshotBlocks", args.Engine, args.Snapshot)
}

func (d *fakeDataPlane) SnapshotClone(_ context.Context, a engineapi.SnapshotCloneArgs) error {
	if a.BackingShared {
		return d.record("SnapshotClone", a.Engine, a.SourceAddress, a.Snapshot, "backing-shared")
	}
	return d.record("SnapshotClone", a.Engine, a.SourceAddress, a.Snapshot)
}

func (d *fakeDataPlane) SnapshotBackup(_ context.Context, a engineapi.SnapshotBackupArgs) error {
	args := []string{a.Engine, a.Snapshot, a.Backup, a.Volume, a.Target.URL}
	if a.BaseBackup != "" {
		args = append(args, "base="+a.BaseBackup+"/"+a.BaseSnapshot)
	}
	return d.record("SnapshotBackup", args...)
}

func (d *fakeDataPlane) BackupRestore(_ context.Context, a engineapi.BackupRestoreArgs) error {
	if a.Backing {
		return d.record("BackupRestore", a.Engine, a.Backup, a.Volume, a.Target.URL, "backing")
	}
	return d.record("BackupRestore", a.Engine, a.Backup, a.Volume, a.Target.URL)
}

func (d *fakeDataPlane) SnapshotLimitsSet(_ context.Context, engine string, maxCount int32, maxSize int64) error {
	return d.record("SnapshotLimitsSet", engine, fmt.Sprint(maxCount), fmt.Sprint(maxSize))
}

func (d *fakeDataPlane) VolumeExpand(_ context.Context, engine string, size int64) error {
	return d.record("VolumeExpand", engine, fmt.Sprint(size))
}

func (d *fakeDataPlane) FrontendStart(_ context.Context, engine, frontend string) error {
	return d.record("FrontendStart", engine, frontend)
}

func (d *fakeDataPlane) FrontendStop(_ context.Context, engine string) error {
	return d.record("FrontendStop", engine)
}

func (d *fakeDataPlane) ReplicaAdd(_ context.Context, engine, replica, address string, rebuild bool) error {
	return d.record("ReplicaAdd", engine, replica, address, fmt.Sprint(rebuild))
}

func (d *fakeDataPlane) ReplicaRemove(_ context.Context, engine, replica string) error {
	return d.record("ReplicaRemove", engine, replica)
}

func (d *fakeDataPlane) ReplicaRebuildStatus(_ context.Context, engine string) (map[string]*engineapi.RebuildStatus, error) {
	return nil, d.record("ReplicaRebuildStatus", engine)
}

func (d *fakeDataPlane) ReplicaDataDelete(_ context.Context, dataDir string) error {
	return d.record("ReplicaDataDelete", dataDir)
}

var _ engineapi.DataPlane = (*fakeDataPlane)(nil)
