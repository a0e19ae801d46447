package imserver

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-storage/strata/engineapi/impb"
)

// nameCases are names a request may carry; wantReason is "" for a good
// one, else what the refusal says.
var nameCases = []struct {
	name, value, wantReason string
}{
	{"short", "r", ""},
	{"a controller's engine name", "pvc-6a1f7c2e-0d3b-4c8e-9f1a-2b3c4d5e6f70-e-1a2b3c4d", ""},
	{"dotted", "vol.example-1", ""},
	{"253 characters", strings.Repeat("a", 253), ""},
	{"dot dot slash dot dot", "../..", "RFC 1123 subdomain"},
	{"a slash", "a/b", "RFC 1123 subdomain"},
	{"dot dot", "..", "RFC 1123 subdomain"},
	{"empty", "", "is empty"},
	{"uppercase", "Vol", "RFC 1123 subdomain"},
	{"underscore", "a_b", "RFC 1123 subdomain"},
	{"254 characters", strings.Repeat("a", 254), "no more than 253 characters"},
}

// wantNameMsg is how a refusal names the field and the value (cut at 253
// characters).
func wantNameMsg(field, value string) string {
	if value == "" {
		return field + " is empty"
	}
	return fmt.Sprintf("%s %.253q: ", field, value)
}

// Issue 46: an instance's name and its volume's name become file names
// (FUSEDir/<volume>/disk, the NBD export), so both must be DNS-1123
// subdomains, refused with InvalidArgument naming the field before any
// path is joined.
func TestInstanceNamesAreChecked(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	fields := []struct {
		field string
		req   func(value, dir string) *impb.InstanceCreateRequest
	}{
		{"name", func(value, dir string) *impb.InstanceCreateRequest { return replicaReq(value, dir, 4*mib) }},
		{"volume_name", func(value, dir string) *impb.InstanceCreateRequest {
			req := replicaReq("r", dir, 4*mib)
			req.VolumeName = value
			return req
		}},
	}
	for _, f := range fields {
		for i, tt := range nameCases {
			t.Run(f.field+"/"+tt.name, func(t *testing.T) {
				req := f.req(tt.value, im.replicaDir(fmt.Sprintf("%s-%d", f.field, i)))
				inst, err := im.s.InstanceCreate(ctx, req)
				if tt.wantReason == "" {
					require.NoError(t, err)
					assert.Equal(t, impb.InstanceState_INSTANCE_STATE_RUNNING, inst.State, inst.Error)
					_, err = im.s.InstanceDelete(ctx, &impb.InstanceRef{Name: req.Name})
					require.NoError(t, err)
					return
				}
				require.Error(t, err)
				assert.Equal(t, codes.InvalidArgument, status.Code(err), err.Error())
				msg := status.Convert(err).Message()
				assert.Contains(t, msg, wantNameMsg(f.field, tt.value))
				assert.Contains(t, msg, tt.wantReason)
				assert.Empty(t, im.s.current(), "nothing was created")
			})
		}
	}
}

// The volume and backup names of a backup or a restore become object keys,
// which on a file:// target are directory and file names: they are
// checked as instance names are, before the engine is looked up (a good
// name gets as far as NotFound for the missing engine).
func TestBackupNamesAreChecked(t *testing.T) {
	im := newTestIM(t, Options{})
	ctx := context.Background()
	target := &impb.BackupTarget{Url: "file://" + t.TempDir()}
	calls := []struct {
		rpc, field string
		call       func(value string) error
	}{
		{"SnapshotBackup", "volume", func(v string) error {
			_, err := im.s.SnapshotBackup(ctx, &impb.SnapshotBackupRequest{Engine: "e", Snapshot: "s", Backup: "b", Volume: v, Target: target})
			return err
		}},
		{"SnapshotBackup", "backup", func(v string) error {
			_, err := im.s.SnapshotBackup(ctx, &impb.SnapshotBackupRequest{Engine: "e", Snapshot: "s", Backup: v, Volume: "v", Target: target})
			return err
		}},
		{"SnapshotBackup", "base_backup", func(v string) error {
			_, err := im.s.SnapshotBackup(ctx, &impb.SnapshotBackupRequest{Engine: "e", Snapshot: "s", Backup: "b", Volume: "v",
				BaseBackup: v, Target: target})
			return err
		}},
		{"BackupRestore", "volume", func(v string) error {
			_, err := im.s.BackupRestore(ctx, &impb.BackupRestoreRequest{Engine: "e", Backup: "b", Volume: v, Target: target})
			return err
		}},
		{"BackupRestore", "backup", func(v string) error {
			_, err := im.s.BackupRestore(ctx, &impb.BackupRestoreRequest{Engine: "e", Backup: v, Volume: "v", Target: target})
			return err
		}},
	}
	for _, c := range calls {
		for _, tt := range nameCases {
			t.Run(c.rpc+"/"+c.field+"/"+tt.name, func(t *testing.T) {
				err := c.call(tt.value)
				require.Error(t, err)
				// No base backup is a full backup, not a bad name.
				if tt.wantReason == "" || (c.field == "base_backup" && tt.value == "") {
					assert.Equal(t, codes.NotFound, status.Code(err), err.Error())
					return
				}
				assert.Equal(t, codes.InvalidArgument, status.Code(err), err.Error())
				msg := status.Convert(err).Message()
				assert.Contains(t, msg, wantNameMsg(c.field, tt.value))
				assert.Contains(t, msg, tt.wantReason)
			})
		}
	}
}
