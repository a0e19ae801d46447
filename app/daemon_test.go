package app

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apiserver/pkg/authentication/user"
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

// The REST API's writes act as the caller: with a bearer token, that token
// and nothing of the manager's; for a client certificate's user (no token
// to pass on), the manager's credentials impersonating the user's name and
// groups, so the API server still judges the write as the user's.
func TestCallerConfigActsAsTheCaller(t *testing.T) {
	manager := &rest.Config{Host: "https://api:6443", BearerToken: "manager-token",
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca")}}
	bob := &user.DefaultInfo{Name: "bob", Groups: []string{"ops", "system:authenticated"}}
	for _, tc := range []struct {
		name      string
		token     string
		wantToken string
		wantAs    rest.ImpersonationConfig
	}{
		{name: "bearer token", token: "user-token", wantToken: "user-token"},
		{name: "client certificate", wantToken: "manager-token",
			wantAs: rest.ImpersonationConfig{UserName: "bob", Groups: []string{"ops", "system:authenticated"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := callerConfig(manager, tc.token, bob)
			assert.Equal(t, tc.wantToken, cfg.BearerToken)
			assert.Equal(t, tc.wantAs, cfg.Impersonate)
			assert.Equal(t, "https://api:6443", cfg.Host)
			assert.Equal(t, []byte("ca"), cfg.CAData)
		})
	}
}
