package kubectlstrata

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// --help names every command, and each command's help its examples.
func TestHelp(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"kubectl-strata", "--help"}, []string{"volume, vol", "snapshot, snap", "backup, bk", "image, bi", "quota", "--token", "--output string, -o string",
			"kubectl strata volume create data --size 1Gi --replicas 2"}},
		{[]string{"kubectl-strata", "volume", "--help"}, []string{"ls, list", "create", "rm, delete", "expand", "attach", "detach", "revert"}},
		{[]string{"kubectl-strata", "snapshot"}, []string{"ls, list", "rm, delete"}},
		{[]string{"kubectl-strata", "volume", "attach", "--help"}, []string{"--node", "--keep", "--ttl", "renews it until"}},
		{[]string{"kubectl-strata", "quota", "set", "--help"}, []string{"NAMESPACE SIZE", "--vm", "kubectl strata quota set apps 5Gi --vm vm1"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			var out bytes.Buffer
			cmd := NewCommand()
			cmd.Writer = &out
			require.NoError(t, cmd.Run(context.Background(), tc.args))
			for _, w := range tc.want {
				assert.Contains(t, out.String(), w)
			}
		})
	}
}

// A command that is not there is an error naming it and what there is,
// not urfave/cli's "No help topic"; kubectl's verbs reach ours; a missing
// argument is named before the cluster is asked anything (the kubeconfig
// here does not exist).
func TestCommandLineErrors(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"kubectl-strata", "volum", "ls"}, `unknown command "volum" for "kubectl strata": it has volume, snapshot, backup, image, quota`},
		{[]string{"kubectl-strata", "volume", "remove", "x"}, `unknown command "remove" for "kubectl strata volume": it has ls, create, rm, expand, attach, revert, detach`},
		{[]string{"kubectl-strata", "quota", "get"}, `unknown command "get" for "kubectl strata quota"`},
		// kubectl's verbs are aliases: they reach the action, which first
		// reads the kubeconfig.
		{[]string{"kubectl-strata", "--kubeconfig", "/nonexistent/kc", "volume", "delete", "x"}, "kubeconfig: stat /nonexistent/kc"},
		{[]string{"kubectl-strata", "--kubeconfig", "/nonexistent/kc", "snapshot", "list", "x"}, "kubeconfig: stat /nonexistent/kc"},
		{[]string{"kubectl-strata", "--kubeconfig", "/nonexistent/kc", "volume", "rm"}, "missing NAME: see kubectl strata volume rm --help"},
		{[]string{"kubectl-strata", "--kubeconfig", "/nonexistent/kc", "snapshot", "create"}, "missing VOLUME: see kubectl strata snapshot create --help"},
		{[]string{"kubectl-strata", "--kubeconfig", "/nonexistent/kc", "quota", "set", "apps"}, "missing SIZE"},
		{[]string{"kubectl-strata", "--kubeconfig", "/nonexistent/kc", "image", "cleanup", "golden"}, "missing DISK-UUID"},
		// An optional argument may be left out: the kubeconfig is read.
		{[]string{"kubectl-strata", "--kubeconfig", "/nonexistent/kc", "snapshot", "create", "v1"}, "kubeconfig: stat /nonexistent/kc"},
		{[]string{"kubectl-strata", "--kubeconfig", "/nonexistent/kc", "backup", "create", "v1"}, "kubeconfig: stat /nonexistent/kc"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			cmd := NewCommand()
			cmd.Writer = &bytes.Buffer{}
			err := cmd.Run(context.Background(), tc.args)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

// Tables are aligned like kubectl's, three spaces between columns.
func TestTable(t *testing.T) {
	var out bytes.Buffer
	p := printer{out: &out, now: func() time.Time { return time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC) }}
	require.NoError(t, p.table([]string{"NAME", "SIZE", "AGE"}, [][]string{
		{"a", "1Gi", p.age(metav1.NewTime(time.Date(2026, 1, 1, 23, 55, 0, 0, time.UTC)))},
		{"longer-name", "16Mi", p.age(metav1.Time{})},
	}))
	assert.Equal(t, "NAME          SIZE   AGE\na             1Gi    5m\nlonger-name   16Mi   <unknown>\n", out.String())

	// Nothing to list: no header, and kubectl's words on the error stream.
	var empty, errOut bytes.Buffer
	require.NoError(t, printer{out: &empty, errOut: &errOut}.table([]string{"NAME"}, nil))
	assert.Empty(t, empty.String())
	assert.Equal(t, "No resources found.\n", errOut.String())
	assert.ErrorContains(t, printer{format: "xml"}.check(), `-o "xml": want json or yaml`)
}

func TestSize(t *testing.T) {
	for in, want := range map[int64]string{0: "0B", 512: "512B", 1024: "1Ki", 3153420: "3Mi", 3 << 20: "3Mi", 3500000: "3.3Mi", 1 << 40: "1Ti"} {
		assert.Equal(t, want, size(in), "%d", in)
	}
}

func TestFillOf(t *testing.T) {
	_, ok := fillOf(&v1beta1.Volume{})
	assert.False(t, ok, "no fill yet")
	f, ok := fillOf(&v1beta1.Volume{Status: v1beta1.VolumeStatus{RestoreStatus: &v1beta1.VolumeRestoreStatus{
		State: v1beta1.VolumeRestoreStateRestoring, Progress: 40}}})
	require.True(t, ok)
	assert.Equal(t, fill{state: "restoring", progress: 40}, f)
	f, _ = fillOf(&v1beta1.Volume{Status: v1beta1.VolumeStatus{CloneStatus: &v1beta1.VolumeCloneStatus{
		State: v1beta1.VolumeCloneStateFailed, Message: "source gone"}}})
	assert.EqualError(t, f.err, "the clone failed: source gone")
	f, _ = fillOf(&v1beta1.Volume{Status: v1beta1.VolumeStatus{CloneStatus: &v1beta1.VolumeCloneStatus{
		State: v1beta1.VolumeCloneStateCompleted, Progress: 100}}})
	assert.True(t, f.done)
}
