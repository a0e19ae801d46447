package types

import (
	"net/netip"
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
		{SettingBackingImageDownloadAllowedNetworks, "", ""},
		{SettingBackingImageDownloadAllowedNetworks, "127.0.0.0/8, ::1, images.example.com", ""},
		{SettingBackingImageDownloadAllowedNetworks, "10.0.0.0/33",
			`setting backing-image-download-allowed-networks: entry "10.0.0.0/33" is not a CIDR: netip.ParsePrefix("10.0.0.0/33"): prefix length out of range`},
		{SettingBackingImageDownloadAllowedNetworks, "127.0.0.0/8,10.0.0.300",
			`setting backing-image-download-allowed-networks: entry "10.0.0.300" is neither a CIDR, an IP address nor a host name`},
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

func TestParseNetworks(t *testing.T) {
	prefixes := func(ps ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range ps {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	tests := []struct {
		value   string
		want    Networks
		wantErr string
	}{
		{value: ""},
		{value: " , ,"},
		{value: "127.0.0.0/8,::1/128", want: Networks{Prefixes: prefixes("127.0.0.0/8", "::1/128")}},
		{value: "10.1.2.3/8", want: Networks{Prefixes: prefixes("10.0.0.0/8")}},
		{value: "192.168.1.10, fd00:ec2::254, ::ffff:10.0.0.1",
			want: Networks{Prefixes: prefixes("192.168.1.10/32", "fd00:ec2::254/128", "10.0.0.1/32")}},
		{value: "Images.Example.com., registry, a-b.c9", want: Networks{Hosts: []string{"images.example.com", "registry", "a-b.c9"}}},
		{value: "10.0.0.0/8,mirror.internal", want: Networks{Prefixes: prefixes("10.0.0.0/8"), Hosts: []string{"mirror.internal"}}},
		{value: "fe80::1%eth0", wantErr: `entry "fe80::1%eth0": an address with a zone cannot be allowed; give it without %eth0`},
		{value: "images.example.com:8080", wantErr: `entry "images.example.com:8080" is neither a CIDR, an IP address nor a host name`},
		{value: "*.example.com", wantErr: `entry "*.example.com" is neither a CIDR, an IP address nor a host name`},
		{value: "http://images", wantErr: `entry "http://images" is not a CIDR`},
		{value: "-bad.example", wantErr: `entry "-bad.example" is neither a CIDR, an IP address nor a host name`},
		{value: "10.0.0.0/", wantErr: `entry "10.0.0.0/" is not a CIDR`},
	}
	for _, tc := range tests {
		t.Run(tc.value, func(t *testing.T) {
			got, err := ParseNetworks(tc.value)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
