package types

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSettingDefaultsAreValid(t *testing.T) {
	for _, name := range SettingNames() {
		assert.NoError(t, ValidateSetting(name, SettingDefinitions[name].Default), name)
	}
}

func TestValidateSetting(t *testing.T) {
	tests := []struct {
		name    SettingName
		value   string
		wantErr string
	}{
		{SettingDefaultReplicaCount, "3", ""},
		{SettingDefaultReplicaCount, "0", "setting default-replica-count: value 0 is outside [1, 20]"},
		{SettingDefaultReplicaCount, "three", `setting default-replica-count: value "three" is not an integer`},
		{SettingDisableSnapshotPurge, "yes", `setting disable-snapshot-purge: value "yes" is not true or false`},
		{SettingDisableSnapshotPurge, "true", ""},
		{SettingBackupTarget, "nfs://server:/export", ""},
		{SettingBackingImageMaxVirtualSize, "0", "setting backing-image-max-virtual-size: value 0 is outside [1, 16384]"},
		{SettingBackingImageMaxVirtualSize, "2048", ""},
		{SettingBackingImageDownloadMaxSize, "16385", "setting backing-image-download-max-size: value 16385 is outside [1, 16384]"},
		{SettingBackingImageDownloadAllowLocal, "loopback", `setting backing-image-download-allow-local-addresses: value "loopback" is not true or false`},
		{"no-such-setting", "1", `unknown setting "no-such-setting"`},
	}
	for _, tc := range tests {
		t.Run(string(tc.name)+"="+tc.value, func(t *testing.T) {
			err := ValidateSetting(tc.name, tc.value)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.wantErr)
		})
	}
}
