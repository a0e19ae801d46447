package app

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/controller"
)

func TestParseDisks(t *testing.T) {
	abs, _ := filepath.Abs("rel/dir")
	tests := []struct {
		name    string
		in      []string
		want    []controller.DiskConfig
		wantErr string
	}{
		{"paths are named by position", []string{"/a", "/b"}, []controller.DiskConfig{{Name: "disk-1", Path: "/a"}, {Name: "disk-2", Path: "/b"}}, ""},
		{"named disk", []string{"fast=/nvme"}, []controller.DiskConfig{{Name: "fast", Path: "/nvme"}}, ""},
		{"relative path is made absolute", []string{"rel/dir"}, []controller.DiskConfig{{Name: "disk-1", Path: abs}}, ""},
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
