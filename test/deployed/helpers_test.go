package deployed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/package/images"
)

// podNamespace holds the tests' claims and Pods, as a user's would.
const podNamespace = "default"

// logsOnFailure logs every Strata Pod's last lines if the test fails, while
// the Pods are still there.
func logsOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(podLogs(context.Background()))
		}
	})
}

func kubectlOut(ctx context.Context, args ...string) (string, error) {
	return kubectlIn(ctx, "", args...)
}

// kubectlIn runs kubectl as the cluster's admin with stdin as its input.
func kubectlIn(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := kubectlCmd(ctx, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// kubectlCmd is kubectl as the cluster's admin.
func kubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "kubectl", args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.cluster.AdminKubeconfig)
	return cmd
}

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectlOut(context.Background(), args...)
	require.NoError(t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
	return out
}

func apply(t *testing.T, manifest string) {
	t.Helper()
	out, err := kubectlIn(context.Background(), manifest, "apply", "-f", "-")
	require.NoError(t, err, "kubectl apply:\n%s\n%s", manifest, out)
}

// claim creates a 64Mi claim of the default StorageClass (from a
// VolumeSnapshot when snapshot is set), deleted when the test ends.
func claim(t *testing.T, name, snapshot string) {
	t.Helper()
	source := ""
	if snapshot != "" {
		source = fmt.Sprintf("dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: %s}", snapshot)
	}
	claimIn(t, podNamespace, name, "64Mi", source)
}

// claimIn creates a claim in namespace with extra fields (YAML flow
// style) added to its spec, deleted when the test ends.
func claimIn(t *testing.T, namespace, name, size, extra string) {
	t.Helper()
	if extra != "" {
		extra = ", " + extra
	}
	apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: %s}}%s}`, name, namespace, size, extra))
	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "-n", namespace, "delete", "pvc", name, "--wait=false")
	})
}

// pod runs script in the workload image on node with the claim at /data;
// it is deleted when the test ends.
func pod(t *testing.T, name, node, claimName, script string) {
	t.Helper()
	podIn(t, podNamespace, name, node, claimName, script, false)
}

// podIn runs script in the workload image in namespace on node, with the
// claim mounted at /data, or as the block device blockDevice; it is
// deleted when the test ends.
func podIn(t *testing.T, namespace, name, node, claimName, script string, block bool) {
	t.Helper()
	podWithSecurity(t, namespace, name, node, claimName, script, block, "{}")
}

// podWithSecurity is podIn with the Pod's securityContext (YAML flow style).
func podWithSecurity(t *testing.T, namespace, name, node, claimName, script string, block bool, security string) {
	t.Helper()
	podWithSecurityContexts(t, namespace, name, node, claimName, script, block, security, "{}")
}

// privilegedPod is pod with its container privileged, as an admin runs
// what needs CAP_SYS_ADMIN (fstrim's FITRIM).
func privilegedPod(t *testing.T, name, node, claimName, script string) {
	t.Helper()
	podWithSecurityContexts(t, podNamespace, name, node, claimName, script, false, "{}", "{privileged: true}")
}

// podWithSecurityContexts is podIn with the Pod's and its container's
// securityContext (YAML flow style).
func podWithSecurityContexts(t *testing.T, namespace, name, node, claimName, script string, block bool, security, containerSecurity string) {
	t.Helper()
	use := "volumeMounts: [{name: data, mountPath: /data}]"
	if block {
		use = "volumeDevices: [{name: data, devicePath: " + blockDevice + "}]"
	}
	apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  nodeName: %s
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  securityContext: %s
  containers: [{name: app, image: %s, command: [sh, -c, %s], securityContext: %s, %s}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: %s}}]`,
		name, namespace, node, security, images.WorkloadRef, strconv.Quote(script), containerSecurity, use, claimName))
	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "-n", namespace, "delete", "pod", name, "--grace-period=1")
	})
	waitPodRunning(t, namespace, name)
}

// blockDevice is where a Pod of podIn finds a block-mode claim.
const blockDevice = "/dev/xvda"

func waitPodRunning(t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	require.Eventually(t, func() bool {
		got, err := env.kube.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		require.NotEqual(t, corev1.PodFailed, got.Status.Phase, "pod %s failed: %+v", name, got.Status)
		p = got
		return got.Status.Phase == corev1.PodRunning
	}, 2*time.Minute, 200*time.Millisecond, "pod %s/%s running", namespace, name)
	return p
}

func exec1(t *testing.T, podName, script string) string {
	t.Helper()
	return execIn(t, podNamespace, podName, script)
}

// execIn runs script in the Pod and returns its standard output alone:
// kubectl exec writes its own client warnings (such as the websocket's
// "Unknown stream id") to stderr, which must not mix into what a test
// compares.
func execIn(t *testing.T, namespace, podName, script string) string {
	t.Helper()
	out, err := tryExecIn(namespace, podName, script)
	require.NoError(t, err, "kubectl exec %s: %s\n%s", podName, script, out)
	return out
}

// tryExecIn is execIn for a caller that retries: standard output alone,
// and the error with kubectl's standard error in it.
func tryExecIn(namespace, podName, script string) (string, error) {
	cmd := kubectlCmd(context.Background(), "-n", namespace, "exec", podName, "--", "sh", "-c", script)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), err
}

// writer writes 256 KiB chunks into 100 slots round-robin (25 MiB of the
// 64 MiB claim), each fsynced and then its checksum fsynced beside it: every
// s<slot> file is the slot's last acknowledged write. Any failed write ends
// the Pod (restartPolicy Never) and its log says which. /tmp/count is
// replaced by a rename, never truncated: a reader between echo's truncate
// and its write read "" (a full make test failed on it).
const writer = `set -e
i=0
while [ ! -f /tmp/stop ]; do
  i=$((i+1)); k=$((i % 100))
  dd if=/dev/urandom of=/data/c$k bs=64k count=4 2>/tmp/dd.err || { cat /tmp/dd.err; echo "chunk $i: dd failed"; exit 1; }
  sync
  sha256sum /data/c$k > /data/s$k.new || { echo "chunk $i: sha256sum failed"; exit 1; }
  mv /data/s$k.new /data/s$k
  sync
  echo $i > /tmp/count.new
  mv /tmp/count.new /tmp/count
  sleep 0.05
done
touch /tmp/stopped
exec sleep 3600`

func written(t *testing.T, podName string) int {
	t.Helper()
	n, err := strconv.Atoi(exec1(t, podName, "cat /tmp/count 2>/dev/null || echo 0"))
	require.NoError(t, err)
	return n
}

// waitWrites waits until the writer has written more chunks than it had;
// it fails at once if the writer stopped on an error.
func waitWrites(t *testing.T, podName string, more int, why string) {
	t.Helper()
	from := written(t, podName)
	var stopped error
	require.Eventually(t, func() bool {
		if stopped = writerStopped(podName); stopped != nil {
			return true
		}
		n, err := strconv.Atoi(execOut(podName, "cat /tmp/count 2>/dev/null || echo 0"))
		return err == nil && n >= from+more
	}, 2*time.Minute, 250*time.Millisecond, "the writer goes on %s", why)
	require.NoError(t, stopped, why)
}

// writerStopped says why the writer's Pod is no longer running, or nil.
func writerStopped(podName string) error {
	p, err := env.kube.CoreV1().Pods(podNamespace).Get(context.Background(), podName, metav1.GetOptions{})
	switch {
	case err != nil:
		return err
	case p.Status.Phase != corev1.PodRunning:
		logs, _ := kubectlOut(context.Background(), "-n", podNamespace, "logs", podName, "--tail=20")
		return fmt.Errorf("the writer stopped (it stops on an I/O error): phase %s, %+v; its log:\n%s",
			p.Status.Phase, p.Status.ContainerStatuses, logs)
	}
	return nil
}

func assertPodRunning(t *testing.T, podName string) {
	t.Helper()
	require.NoError(t, writerStopped(podName))
}

func execOut(podName, script string) string {
	out, _ := tryExecIn(podNamespace, podName, script)
	return out
}

// stopAndVerify stops the writer and checks every acknowledged chunk.
func stopAndVerify(t *testing.T, podName string) int {
	t.Helper()
	exec1(t, podName, "touch /tmp/stop")
	require.Eventually(t, func() bool {
		_, err := kubectlOut(context.Background(), "-n", podNamespace, "exec", podName, "--", "test", "-f", "/tmp/stopped")
		return err == nil
	}, time.Minute, 200*time.Millisecond, "the writer stopped")
	assertPodRunning(t, podName)
	n := written(t, podName)
	slots := min(n, 100)
	out := exec1(t, podName, "cat /data/s* | sha256sum -c 2>&1 | grep -v ': OK$'; ls /data | grep -c '^s[0-9]*$'")
	lines := strings.Split(out, "\n")
	require.Equal(t, []string{strconv.Itoa(slots)}, lines,
		"every slot's last acknowledged chunk reads back: before the slot count, the checks that failed")
	return n
}

func volumeOfClaim(t *testing.T, name string) string {
	t.Helper()
	return volumeOfClaimIn(t, podNamespace, name)
}

func volumeOfClaimIn(t *testing.T, namespace, name string) string {
	t.Helper()
	var volume string
	require.Eventually(t, func() bool {
		pvc, err := env.kube.CoreV1().PersistentVolumeClaims(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || pvc.Status.Phase != corev1.ClaimBound {
			return false
		}
		volume = pvc.Spec.VolumeName
		return true
	}, 2*time.Minute, 200*time.Millisecond, "claim %s bound", name)
	return volume
}

func getVolume(t *testing.T, name string) *v1beta1.Volume {
	t.Helper()
	v, err := env.strata.StrataV1beta1().Volumes(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return v
}

// clusterNode is the local cluster's kubelet node of that name: its
// directories are on this host.
func clusterNode(t *testing.T, name string) *localcluster.Node {
	t.Helper()
	for _, n := range env.cluster.Nodes() {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s", name)
	return nil
}

// podOf is the name of the Pod of component (strata-manager,
// strata-instance-manager, …) on node.
func podOf(t *testing.T, component, node string) string {
	t.Helper()
	pods, err := env.kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app=" + component, FieldSelector: "spec.nodeName=" + node})
	require.NoError(t, err)
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			return p.Name
		}
	}
	require.Failf(t, "no pod", "no %s Pod on %s", component, node)
	return ""
}

// replaceNodePod deletes component's Pod on node and waits for its
// DaemonSet's new Pod to be ready.
func replaceNodePod(t *testing.T, component, node string) {
	t.Helper()
	old := podOf(t, component, node)
	kubectl(t, "-n", ns, "delete", "pod", old, "--wait=false")
	require.Eventually(t, func() bool {
		pods, err := env.kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{
			LabelSelector: "app=" + component, FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if p.Name != old && podReady(&p) {
				return true
			}
		}
		return false
	}, 2*time.Minute, 250*time.Millisecond, "%s's DaemonSet brings a new Pod up on %s", component, node)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// takeVolumeSnapshot asks for a VolumeSnapshot of claimName, deleted when
// the test ends; the error is kubectl's (an admission denial among them).
func takeVolumeSnapshot(t *testing.T, namespace, name, claimName string) error {
	t.Helper()
	out, err := kubectlIn(context.Background(), fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec: {volumeSnapshotClassName: strata, source: {persistentVolumeClaimName: %s}}`, name, namespace, claimName),
		"apply", "-f", "-")
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "-n", namespace, "delete", "volumesnapshot", name, "--wait=false")
	})
	return nil
}

func waitVolumeSnapshotReady(t *testing.T, namespace, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		out, err := kubectlOut(context.Background(), "-n", namespace, "get", "volumesnapshot", name,
			"-o", "jsonpath={.status.readyToUse}")
		return err == nil && out == "true"
	}, 2*time.Minute, 200*time.Millisecond, "VolumeSnapshot %s/%s readyToUse", namespace, name)
}
