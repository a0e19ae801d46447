package imserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

func manyLabels(n int) map[string]string {
	out := map[string]string{}
	for i := range n {
		out[fmt.Sprintf("k%d", i)] = "v"
	}
	return out
}

func manyReplicas(n int) map[string]string {
	out := map[string]string{}
	for i := range n {
		out[fmt.Sprintf("r%d", i)] = "127.0.0.1:1"
	}
	return out
}

// Issue 24: requests are bounded, so none makes the instance manager
// allocate or spawn without limit. Each refusal is InvalidArgument and
// names the field, before any engine is looked up.
func TestRequestsAreBounded(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	tooBig := int64(engineapi.MaxVolumeSize) + 4096
	tests := []struct {
		name    string
		call    func() error
		wantMsg string
	}{
		{"replica beyond the largest volume", func() error {
			_, err := im.s.InstanceCreate(ctx, replicaReq("r", im.replicaDir("r"), tooBig))
			return err
		}, fmt.Sprintf("size %d exceeds the largest volume", tooBig)},
		{"engine beyond the largest volume", func() error {
			_, err := im.s.InstanceCreate(ctx, engineReq("e", tooBig, manyReplicas(1)))
			return err
		}, "exceeds the largest volume"},
		{"size not in blocks", func() error {
			_, err := im.s.InstanceCreate(ctx, replicaReq("r", im.replicaDir("r"), 4097))
			return err
		}, "size 4097 must be a positive multiple of 4096"},
		{"engine with a path", func() error {
			req := engineReq("e", 4*mib, manyReplicas(1))
			req.BackingFile = "/etc/passwd"
			_, err := im.s.InstanceCreate(ctx, req)
			return err
		}, "data_dir and backing_file are for replicas"},
		{"engine with too many replicas", func() error {
			_, err := im.s.InstanceCreate(ctx, engineReq("e", 4*mib, manyReplicas(maxEngineReplicas+1)))
			return err
		}, "replicas has 33 entries, more than 32"},
		{"expand beyond the largest volume", func() error {
			_, err := im.s.VolumeExpand(ctx, &impb.VolumeExpandRequest{Engine: "e", Size: 15<<40 + tooBig})
			return err
		}, "engine e: size"},
		{"too many snapshot labels", func() error {
			_, err := im.s.SnapshotCreate(ctx, &impb.SnapshotCreateRequest{Engine: "e", Labels: manyLabels(maxLabels + 1)})
			return err
		}, "labels has 65 entries, more than 64"},
		{"a huge label value", func() error {
			_, err := im.s.SnapshotCreate(ctx, &impb.SnapshotCreateRequest{Engine: "e",
				Labels: map[string]string{"k": strings.Repeat("v", maxLabelValueLen+1)}})
			return err
		}, `labels["k"] is 1025 bytes`},
		{"a huge label key", func() error {
			_, err := im.s.SnapshotCreate(ctx, &impb.SnapshotCreateRequest{Engine: "e",
				Labels: map[string]string{strings.Repeat("k", maxLabelKeyLen+1): "v"}})
			return err
		}, "is 318 bytes, more than 317"},
		{"too many names to remove", func() error {
			_, err := im.s.SnapshotRemove(ctx, &impb.SnapshotRemoveRequest{Engine: "e", Names: make([]string, maxSnapshotNames+1)})
			return err
		}, "names has 65537 entries"},
		{"backup labels", func() error {
			_, err := im.s.SnapshotBackup(ctx, &impb.SnapshotBackupRequest{Engine: "e", Snapshot: "s", Backup: "b", Volume: "v",
				Labels: manyLabels(maxLabels + 1)})
			return err
		}, "labels has 65 entries"},
		{"backup concurrency", func() error {
			_, err := im.s.SnapshotBackup(ctx, &impb.SnapshotBackupRequest{Engine: "e", Snapshot: "s", Backup: "b", Volume: "v",
				Concurrency: 1000})
			return err
		}, "concurrency 1000 must be between 0 (the default) and 64"},
		{"freeze without a cut", func() error {
			_, err := im.s.EngineFreeze(ctx, &impb.EngineFreezeRequest{Engine: "e", TimeoutMs: 1000})
			return err
		}, "cut: required"},
		{"freeze beyond a minute", func() error {
			_, err := im.s.EngineFreeze(ctx, &impb.EngineFreezeRequest{Engine: "e", Cut: "c", TimeoutMs: 60001})
			return err
		}, "timeout_ms 60001: must be above 0 and at most 60000"},
		{"negative restore concurrency", func() error {
			_, err := im.s.BackupRestore(ctx, &impb.BackupRestoreRequest{Engine: "e", Backup: "b", Volume: "v", Concurrency: -1})
			return err
		}, "concurrency -1 must be between"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			require.Error(t, err)
			assert.Equal(t, codes.InvalidArgument, status.Code(err), err.Error())
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
}

// An engine takes at most maxEngineReplicas replicas through ReplicaAdd too.
func TestReplicaAddIsBounded(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	rep := im.createReplica(t, "r", 4*mib)
	replicas := manyReplicas(maxEngineReplicas - 1) // unreachable: listed in ERR
	replicas["r"] = rep.Address
	_, err := im.c.InstanceCreate(ctx, engineReq("e", 4*mib, replicas))
	require.NoError(t, err)
	_, err = im.s.ReplicaAdd(ctx, &impb.ReplicaAddRequest{Engine: "e", Replica: "one-more", Address: unusedAddress(t)})
	require.Error(t, err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), err.Error())
	assert.Contains(t, err.Error(), "engine e has 32 replicas, the most one takes")
}

// The state file's names are checked when it is read back, as a request's
// are: a name that could not have been created is never joined into a path.
func TestLoadSpecsChecksNames(t *testing.T) {
	for _, tc := range []struct {
		name, specs, wantErr string
	}{
		{"good", `[{"name":"v1-r-0a1b2c3d","type":2,"volumeName":"v1","size":4096}]`, ""},
		{"volume name outside", `[{"name":"v1-r-0a1b2c3d","type":2,"volumeName":"../../etc","size":4096}]`, `instance 0: volumeName "../../etc"`},
		{"empty name", `[{"name":"","type":2,"volumeName":"v1","size":4096}]`, "instance 0: name is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, specsFile), []byte(tc.specs), 0o600))
			specs, err := loadSpecs(dir)
			if tc.wantErr == "" {
				require.NoError(t, err)
				assert.Len(t, specs, 1)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}
