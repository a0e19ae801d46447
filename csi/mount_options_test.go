package csi

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// xfs claims restored or cloned on the node of their source carry its
// UUID: they mount with nouuid, or the kernel refuses them.
func TestMountOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		fsType string
		flags  []string
		want   []string
	}{
		"ext4 as given":      {"ext4", []string{"noatime"}, []string{"noatime"}},
		"ext4 none":          {"ext4", nil, nil},
		"xfs gets nouuid":    {"xfs", nil, []string{"nouuid"}},
		"xfs keeps flags":    {"xfs", []string{"noatime"}, []string{"noatime", "nouuid"}},
		"xfs nouuid already": {"xfs", []string{"nouuid"}, []string{"nouuid"}},
	} {
		t.Run(name, func(t *testing.T) {
			flags := append([]string(nil), tc.flags...)
			assert.Equal(t, tc.want, mountOptions(tc.fsType, flags))
			assert.Equal(t, tc.flags, flags, "the caller's slice is left alone")
		})
	}
}
