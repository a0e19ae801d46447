package nbddev

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBesideKubepods(t *testing.T) {
	tests := []struct{ path, want string }{
		{"/kubepods/besteffort/pod1/c1", "/"},
		{"/strata-1a2b-127-0-0-2/kubepods/burstable/pod1/c1", "/strata-1a2b-127-0-0-2"},
		{"/kubepods.slice/kubepods-burstable.slice/cri-containerd-1.scope", "/"},
		{"/", "/"},
		{"", "/"},
		{"/system.slice/containerd.service", "/"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			assert.Equal(t, tc.want, besideKubepods(tc.path))
		})
	}
}

// The cgroup filesystem is faked with plain files: what is checked is
// where the pid is written, per hierarchy.
func TestMoveToDaemonCgroup(t *testing.T) {
	const self = "12:cpuset:/n1/kubepods/pod1/c1\n11:cpu,cpuacct:/n1/kubepods/pod1/c1\n1:name=systemd:/n1/kubepods/pod1/c1\n0::/\n"
	tests := []struct {
		name    string
		setup   func(t *testing.T, root string)
		want    []string // files that must hold the pid
		wantErr string
	}{
		{name: "v1: every hierarchy, beside the node's kubepods; cpuset gets its parent's CPUs",
			setup: func(t *testing.T, root string) {
				for _, h := range []string{"cpuset", "cpu,cpuacct", "systemd"} {
					write(t, filepath.Join(root, h, "cgroup.procs"), "")
				}
				write(t, filepath.Join(root, "cpuset", "cpuset.cpus"), "0-1\n")
				write(t, filepath.Join(root, "cpuset", "n1", "strata-nbdfuse", "cpuset.cpus"), "")
				require.NoError(t, os.Symlink("cpu,cpuacct", filepath.Join(root, "cpu")))
			},
			want: []string{"cpuset/n1/strata-nbdfuse/cgroup.procs", "cpu,cpuacct/n1/strata-nbdfuse/cgroup.procs",
				"systemd/n1/strata-nbdfuse/cgroup.procs"}},
		{name: "v2: the one hierarchy (a private namespace shows /)",
			setup: func(t *testing.T, root string) { write(t, filepath.Join(root, "cgroup.controllers"), "cpu io memory") },
			want:  []string{"strata-nbdfuse/cgroup.procs"}},
		{name: "nothing that is a hierarchy: an error naming the root",
			setup: func(t *testing.T, root string) { write(t, filepath.Join(root, "README"), "") }, wantErr: "no cgroup hierarchy under"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, root)
			err := moveToDaemonCgroup(root, self, 4242)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			for _, f := range tc.want {
				got, err := os.ReadFile(filepath.Join(root, f))
				require.NoError(t, err, f)
				assert.Equal(t, "4242", string(got), f)
			}
			if cpus, err := os.ReadFile(filepath.Join(root, "cpuset", "n1", "strata-nbdfuse", "cpuset.cpus")); err == nil {
				assert.Equal(t, "0-1\n", string(cpus))
			}
			_, err = os.Stat(filepath.Join(root, "cpu", "n1"))
			assert.True(t, err == nil || os.IsNotExist(err))
		})
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}
