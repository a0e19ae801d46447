package app

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/controller/node"
)

func TestParseDisks(t *testing.T) {
	abs, _ := filepath.Abs("rel/dir")
	tests := []struct {
		name    string
		in      []string
		want    []node.DiskConfig
		wantErr string
	}{
		{"paths are named by position", []string{"/a", "/b"}, []node.DiskConfig{{Name: "disk-1", Path: "/a"}, {Name: "disk-2", Path: "/b"}}, ""},
		{"named disk", []string{"fast=/nvme"}, []node.DiskConfig{{Name: "fast", Path: "/nvme"}}, ""},
		{"relative path is made absolute", []string{"rel/dir"}, []node.DiskConfig{{Name: "disk-1", Path: abs}}, ""},
		{"empty name", []string{"=/x"}, nil, `--disk "=/x": want PATH or NAME=PATH`},
		{"empty path", []string{"x="}, nil, `--disk "x=": want PATH or NAME=PATH`},
		{"duplicate name", []string{"a=/x", "a=/y"}, nil, `--disk "a=/y": disk name a is used twice`},
		{"no disks", nil, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDisks(tc.in)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// The REST API's writes for a bearer token's user act with that token and
// nothing of the manager's; the manager never impersonates (issue 46):
// certificate users' writes are the manager's own, after their review.
func TestCallerConfigActsAsTheCaller(t *testing.T) {
	manager := &rest.Config{Host: "https://api:6443", BearerToken: "manager-token",
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CertData: []byte("manager-cert"), KeyData: []byte("manager-key")}}
	cfg := callerConfig(manager, "user-token")
	assert.Equal(t, "user-token", cfg.BearerToken)
	assert.Empty(t, cfg.CertData)
	assert.Empty(t, cfg.KeyData)
	assert.Equal(t, rest.ImpersonationConfig{}, cfg.Impersonate)
	assert.Equal(t, "https://api:6443", cfg.Host)
	assert.Equal(t, []byte("ca"), cfg.CAData)

	plain := &rest.Config{Host: "https://api:6443", BearerToken: "manager-token"}
	none, err := managerWrites(plain, false)
	require.NoError(t, err)
	assert.Nil(t, none, "no client certificates taken: no writes for them")
	some, err := managerWrites(plain, true)
	require.NoError(t, err)
	assert.NotNil(t, some)
}
