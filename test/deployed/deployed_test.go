package deployed

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	volumectl "github.com/strata-storage/strata/controller/volume"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Every component runs as a Pod on the three nodes, and no strata-manager
// runs on the host outside a container.
func TestEveryComponentIsAPod(t *testing.T) {
	out := kubectl(t, "-n", ns, "get", "pods", "-o", "wide")
	t.Logf("kubectl -n %s get pods -o wide:\n%s", ns, out)
	for _, component := range []string{"strata-manager", "strata-instance-manager", "strata-csi-node"} {
		for _, node := range env.nodes {
			name := podOf(t, component, node)
			assert.Eventually(t, func() bool {
				p, err := env.kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
				return err == nil && podReady(p)
			}, time.Minute, 250*time.Millisecond, "%s ready", name)
		}
	}
	assert.Contains(t, out, "strata-csi-controller-")
	assert.Contains(t, kubectl(t, "-n", "kube-system", "get", "pods"), "snapshot-controller-")

	found := 0
	for _, p := range hostProcesses(t) {
		if !strings.HasPrefix(p.cmdline, "/usr/local/bin/strata-manager\x00") {
			continue
		}
		found++
		assert.True(t, p.inPod, "strata-manager %d runs outside a Pod", p.pid)
	}
	// Three managers, three instance managers, three CSI node plugins and
	// the CSI controller plugin (more with other suites' Pods around).
	assert.GreaterOrEqual(t, found, 10, "strata-manager processes in containers")
}

// The seed's flow on the install: a claim used by a Pod on one node, a
// VolumeSnapshot of it, a claim restored from that read by a Pod on
// another node.
func testSnapshotRestoredOnAnotherNode(t *testing.T) {
	logsOnFailure(t)
	claim(t, "src", "")
	pod(t, "src", "127.0.0.1", "src", "mkdir -p /data/tree && for i in 1 2 3 4 5; do dd if=/dev/urandom of=/data/tree/f$i bs=64k count=8 2>/dev/null; done; sync; exec sleep 3600")
	digest := "cd /data/tree && sha256sum f1 f2 f3 f4 f5"
	var before string
	require.Eventually(t, func() bool {
		out, err := tryExecIn(podNamespace, "src", digest)
		before = out
		return err == nil && strings.Count(out, "\n") == 4
	}, time.Minute, 200*time.Millisecond, "the files are written")
	requireOnTheInstanceManagersFile(t, "127.0.0.1", volumeOfClaim(t, "src"))

	require.NoError(t, takeVolumeSnapshot(t, podNamespace, "src-snap", "src"))
	waitVolumeSnapshotReady(t, podNamespace, "src-snap")
	exec1(t, "src", "rm -f /data/tree/f1 && sync") // after the snapshot: not in the restore

	claim(t, "restored", "src-snap")
	pod(t, "restored", "127.0.0.2", "restored", "exec sleep 3600")
	assert.Equal(t, before, exec1(t, "restored", digest), "the restored claim holds the files as snapshotted")
	v := getVolume(t, volumeOfClaim(t, "restored"))
	assert.Equal(t, "127.0.0.2", v.Status.CurrentNodeID)
}

// requireOnTheInstanceManagersFile checks that the node plugin put the
// claim's device on the file the instance manager's Pod serves in the
// node's hostDir (instanceManager.fuseFiles), not on nbdfuse.
func requireOnTheInstanceManagersFile(t *testing.T, nodeName, volume string) {
	t.Helper()
	loopDeviceOf(t, nodeName, volume)
}

// loopDeviceOf is the claim's loop device on node, on the file the
// instance manager's Pod serves the volume as.
func loopDeviceOf(t *testing.T, nodeName, volume string) string {
	t.Helper()
	file := engineapi.FUSEFile(fuseDir(t, nodeName), volume)
	on := localcluster.LoopDevicesOn(func(backing string) bool { return backing == file })
	require.Len(t, on, 1, "one loop device on %s", file)
	return on[0]
}

// tlsDir is where node's manager writes its instance manager's certificate
// and CA bundle (the chart's hostDir/tls).
func tlsDir(t *testing.T, node string) string {
	t.Helper()
	return filepath.Join(clusterNode(t, node).StrataDir(), "tls")
}

// process is one process of this machine, as /proc tells it.
type process struct {
	pid     int
	cmdline string            // NUL-separated, as /proc gives it
	inPod   bool              // in a kubelet's cgroup (kubepods)
	status  map[string]string // /proc/<pid>/status, field by field
}

// hostProcesses are this machine's processes (the local cluster's nodes
// all run here); one gone while it is read is left out.
func hostProcesses(t *testing.T) []process {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var out []process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		cgroup, err1 := os.ReadFile(filepath.Join(dir, "cgroup"))
		cmdline, err2 := os.ReadFile(filepath.Join(dir, "cmdline"))
		status, err3 := os.ReadFile(filepath.Join(dir, "status"))
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		fields := map[string]string{}
		for line := range strings.Lines(string(status)) {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
		out = append(out, process{pid: pid, cmdline: string(cmdline), inPod: strings.Contains(string(cgroup), "kubepods"),
			status: fields})
	}
	return out
}

// fuseDir is where the instance manager of node serves volumes as files
// (the chart's hostDir/fuse).
func fuseDir(t *testing.T, node string) string {
	t.Helper()
	return filepath.Join(clusterNode(t, node).StrataDir(), "fuse")
}

// A manager Pod deleted (and brought back by its DaemonSet) on the node of a
// Pod writing to its claim: the writes go on, every one reads back. The
// data plane is the instance manager's Pod, which the manager's restart
// leaves alone.
func TestManagerPodDeletedWhileAWriterRuns(t *testing.T) {
	logsOnFailure(t)
	claim(t, "mgr-w", "")
	pod(t, "mgr-w", "127.0.0.3", "mgr-w", writer)
	waitWrites(t, "mgr-w", 5, "from the start")
	volume := volumeOfClaim(t, "mgr-w")
	owner := getVolume(t, volume).Status.OwnerID
	for _, node := range uniq("127.0.0.3", owner) {
		replaceNodePod(t, "strata-manager", node)
		waitWrites(t, "mgr-w", 10, "after the manager of "+node+" was replaced")
	}
	require.Eventually(t, func() bool {
		v := getVolume(t, volume)
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy && v.Status.State == v1beta1.VolumeStateAttached
	}, time.Minute, 250*time.Millisecond, "the volume stays attached and healthy")
	t.Logf("%d chunks written and verified across the managers' replacement", stopAndVerify(t, "mgr-w"))
}

// An instance-manager Pod deleted on a node holding one of a written
// volume's replicas (not its engine): the volume degrades, the replica is
// rebuilt once the DaemonSet's new Pod is up, the writer never sees an
// error and every acknowledged write reads back.
func TestInstanceManagerPodDeletedWhileAWriterRuns(t *testing.T) {
	logsOnFailure(t)
	claim(t, "im-w", "")
	pod(t, "im-w", "127.0.0.1", "im-w", writer)
	waitWrites(t, "im-w", 5, "from the start")
	volume := volumeOfClaim(t, "im-w")
	victim := replicaNodeOtherThan(t, volume, "127.0.0.1")
	start := time.Now()
	replaceNodePod(t, "strata-instance-manager", victim)
	// The degradation may be over before the new Pod is ready (the rebuild
	// takes seconds), so it is read from the volume's ReplicaFailed event,
	// which stays, rather than sampled.
	var stopped error
	require.Eventually(t, func() bool {
		if stopped = writerStopped("im-w"); stopped != nil {
			return true
		}
		v, err := env.strata.StrataV1beta1().Volumes(ns).Get(context.Background(), volume, metav1.GetOptions{})
		return err == nil && replicaFailedOn(volume, victim) && v.Status.Robustness == v1beta1.VolumeRobustnessHealthy
	}, 3*time.Minute, 250*time.Millisecond, "the volume degrades (a replica on %s failed), then is rebuilt healthy", victim)
	require.NoError(t, stopped)
	t.Logf("instance manager of %s replaced; volume healthy again after %s", victim, time.Since(start).Round(time.Second))
	waitWrites(t, "im-w", 5, "after the rebuild")
	t.Logf("%d chunks written and verified across the instance manager's replacement", stopAndVerify(t, "im-w"))
}

// replicaFailedOn tells whether the volume has a ReplicaFailed event for a
// replica on node.
func replicaFailedOn(volume, node string) bool {
	events, err := env.kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + volume + ",reason=" + volumectl.EventReasonReplicaFailed})
	if err != nil {
		return false
	}
	return slices.ContainsFunc(events.Items, func(e corev1.Event) bool { return strings.Contains(e.Message, " on "+node+" failed") })
}

// replicaNodeOtherThan is a node holding a running replica of volume that
// is not node.
func replicaNodeOtherThan(t *testing.T, volume, node string) string {
	t.Helper()
	var found string
	require.Eventually(t, func() bool {
		replicas, err := env.strata.StrataV1beta1().Replicas(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, r := range replicas.Items {
			if r.Spec.VolumeName == volume && r.Spec.NodeID != node && r.Status.CurrentState == v1beta1.InstanceStateRunning {
				found = r.Spec.NodeID
				return true
			}
		}
		return false
	}, time.Minute, 250*time.Millisecond, "a running replica of %s off %s", volume, node)
	return found
}

func uniq(items ...string) []string {
	var out []string
	for _, s := range items {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// helm template with the install's values, applied as a server-side dry
// run: a real API server (schemas, CRDs, admission webhooks) accepts every
// object the chart renders. (package/deploy/strata.yaml is that rendering
// with the default values; package/deploy's tests hold it to the chart.)
func TestHelmTemplateAppliesServerSide(t *testing.T) {
	helmDir, err := localcluster.BuildTools(context.Background(), logrus.New(), "helm")
	require.NoError(t, err)
	render := exec.Command(filepath.Join(helmDir, "helm"), "template", "strata", filepath.Join(env.root, "package", "chart", "strata"),
		"--namespace", ns, "--values", filepath.Join(env.cluster.Dir, "helm-values.json"))
	manifest, err := render.Output()
	require.NoError(t, err, "helm template")
	out, err := kubectlIn(context.Background(), string(manifest), "apply", "--server-side", "--force-conflicts",
		"--dry-run=server", "-f", "-")
	require.NoError(t, err, "kubectl apply --dry-run=server:\n%s", out)
	assert.Contains(t, out, "daemonset.apps/strata-manager-127.0.0.1 serverside-applied (server dry run)")
	assert.Contains(t, out, "storageclass.storage.k8s.io/strata serverside-applied (server dry run)")
}
