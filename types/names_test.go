package types

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestValidateSnapshotName(t *testing.T) {
	tests := []struct {
		name    string
		wantErr string // "" means valid
	}{
		{"a", ""},
		{"snap-1", ""},
		{"S.2_x-y", ""},
		{"0", ""},
		{strings.Repeat("x", 63), ""},
		{"volume-head-1", ""},
		{"", `invalid snapshot name: "" must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`},
		{strings.Repeat("x", 64), "must match"},
		{"-a", "must match"},
		{".a", "must match"},
		{"_a", "must match"},
		{"a/b", `invalid snapshot name: "a/b" must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`},
		{"a b", "must match"},
		{"é", "must match"},
		{"a\x00", "must match"},
		{"..", "must match"},
		{VolumeHeadName, `invalid snapshot name: "volume-head" is reserved for the head`},
	}
	for _, tc := range tests {
		err := ValidateSnapshotName(tc.name)
		if tc.wantErr == "" {
			assert.NoError(t, err, "%q", tc.name)
			continue
		}
		if assert.Error(t, err, "%q", tc.name) {
			assert.ErrorIs(t, err, ErrInvalidSnapshotName, "%q", tc.name)
			assert.Contains(t, err.Error(), tc.wantErr, "%q", tc.name)
		}
	}
}
