package localcluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
)

// A process Node takes no Pod, not even a DaemonSet's (which tolerates
// spec.unschedulable but not the taints), and is recognisable as the
// local cluster's.
func TestProcessNodeTakesNoPod(t *testing.T) {
	n := processNode("node-1")
	assert.Equal(t, "node-1", n.Name)
	assert.True(t, n.Spec.Unschedulable)
	var effects []corev1.TaintEffect
	for _, taint := range n.Spec.Taints {
		assert.Equal(t, NoKubeletTaint, taint.Key)
		effects = append(effects, taint.Effect)
	}
	assert.ElementsMatch(t, []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute}, effects)
	assert.True(t, IsProcessNode(n))

	sel, err := labels.Parse(KubeletNodeSelector)
	require.NoError(t, err)
	assert.False(t, sel.Matches(labels.Set(n.Labels)), "the kubelet nodes' selector leaves it out")
	assert.True(t, sel.Matches(labels.Set{"kubernetes.io/hostname": "127.0.0.1"}))
}

// A process Node is made once and reused (its UID, which bound tokens
// name, stays); a kubelet's Node is used as it is and never deleted.
func TestProcessNodeMadeOnceDeletedAlone(t *testing.T) {
	ctx := t.Context()
	kubelet := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "127.0.0.1", UID: "kubelet-uid"}}
	cs := fake.NewClientset(kubelet)

	n, created, err := ensureProcessNode(ctx, cs, "node-1")
	require.NoError(t, err)
	assert.True(t, created)
	assert.True(t, IsProcessNode(n))
	n.UID = "node-1-uid" // the fake sets none
	_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)

	again, created, err := ensureProcessNode(ctx, cs, "node-1")
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, n.UID, again.UID)

	got, created, err := ensureProcessNode(ctx, cs, "127.0.0.1")
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, kubelet.UID, got.UID)
	assert.False(t, IsProcessNode(got))

	deleted, err := deleteProcessNodes(ctx, cs)
	require.NoError(t, err)
	assert.Equal(t, []string{"node-1"}, deleted)
	_, err = cs.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err))
	_, err = cs.CoreV1().Nodes().Get(ctx, "127.0.0.1", metav1.GetOptions{})
	assert.NoError(t, err, "the kubelet's Node stays")
}

// echoBin is a stand-in strata-manager that prints its arguments and exits.
func echoBin(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "strata-manager")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\necho \"$@\"\n"), 0o755))
	return bin
}

func waitExit(t *testing.T, p *Process) string {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit", p.Name)
	}
	b, err := os.ReadFile(p.LogPath)
	require.NoError(t, err)
	return string(b)
}

// Each start of a node's manager, a restart included, asks NodeKubeconfig
// for that node's kubeconfig; without it every manager shares Kubeconfig.
func TestManagerOptionsNodeKubeconfig(t *testing.T) {
	opts := ManagerOptions{Bin: echoBin(t), Kubeconfig: "/shared.kubeconfig", Namespace: "strata-system",
		RunDir: t.TempDir(), LeaseDuration: 3 * time.Second}
	m, err := StartManager(opts, "node-1")
	require.NoError(t, err)
	assert.Contains(t, waitExit(t, m.Process), "--kubeconfig /shared.kubeconfig ")

	var asked []string
	opts.NodeKubeconfig = func(node string) (string, error) {
		asked = append(asked, node)
		return "/" + node + ".kubeconfig", nil
	}
	m, err = StartManager(opts, "node-2")
	require.NoError(t, err)
	waitExit(t, m.Process)
	m, err = m.Restart(opts)
	require.NoError(t, err)
	out := waitExit(t, m.Process)
	assert.Equal(t, []string{"node-2", "node-2"}, asked)
	assert.Equal(t, 2, strings.Count(out, "--node-name node-2 --kubeconfig /node-2.kubeconfig "), out)

	opts.NodeKubeconfig = func(string) (string, error) { return "", errors.New("no token") }
	_, err = StartManager(opts, "node-3")
	assert.ErrorContains(t, err, "kubeconfig of node node-3's manager: no token")
}

// The signer runs `ca-signer` with the managers' namespace and lease, its
// own kubeconfig and identity, and logs to logs/ca-signer.log.
func TestSignerOptionsFromManagers(t *testing.T) {
	managers := ManagerOptions{Bin: echoBin(t), Kubeconfig: "/manager.kubeconfig", Namespace: "strata-system",
		RunDir: t.TempDir(), LeaseDuration: 3 * time.Second}
	opts := managers.SignerOptions("/signer.kubeconfig")
	assert.Equal(t, filepath.Join(managers.RunDir, "logs", "ca-signer.log"), opts.LogPath())
	s, err := StartSigner(opts)
	require.NoError(t, err)
	assert.Equal(t, SignerIdentity, s.Identity)
	assert.Equal(t, "ca-signer --kubeconfig /signer.kubeconfig --namespace strata-system --identity local-signer --lease-duration 3s\n",
		waitExit(t, s.Process))

	opts.Identity, opts.LeaseDuration, opts.Args = "second", 0, []string{"--ca-rotate-before", "1h"}
	assert.Equal(t, filepath.Join(managers.RunDir, "logs", "ca-signer-second.log"), opts.LogPath())
	s, err = StartSigner(opts)
	require.NoError(t, err)
	waitExit(t, s.Process)
	s, err = s.Restart()
	require.NoError(t, err)
	out := waitExit(t, s.Process)
	assert.Equal(t, 2, strings.Count(out, "ca-signer --kubeconfig /signer.kubeconfig --namespace strata-system --identity second "+
		"--lease-duration 10s --ca-rotate-before 1h\n"), out)
}

// A supervised signer that exits is started again; Stop ends both.
func TestSignerSupervisorRestartsTheSigner(t *testing.T) {
	opts := ManagerOptions{Bin: echoBin(t), Namespace: "strata-system", RunDir: t.TempDir()}.SignerOptions("/signer.kubeconfig")
	s, err := StartSigner(opts)
	require.NoError(t, err)
	log := logrus.New()
	log.SetOutput(t.Output())
	ss := SuperviseSigner(log, s)
	require.Eventually(t, func() bool { return ss.Restarts() >= 1 }, 10*time.Second, 50*time.Millisecond)
	require.NoError(t, ss.Stop(time.Second))
	assert.NotSame(t, s, ss.Signer())
	b, err := os.ReadFile(opts.LogPath())
	require.NoError(t, err)
	assert.Contains(t, string(b), "--- supervisor ")
}
