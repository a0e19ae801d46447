package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/package/images"
)

// podNamespace holds the test Pods; "default" exists in every cluster.
const podNamespace = "default"

func TestKubeletNodesAreReady(t *testing.T) {
	nodes, err := env.adminKube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	byName := map[string]corev1.Node{}
	for _, n := range nodes.Items {
		byName[n.Name] = n
	}
	for _, name := range localcluster.DefaultNodeNames {
		n, ok := byName[name]
		require.True(t, ok, "node %s registered", name)
		assert.True(t, localcluster.NodeReady(&n), "node %s Ready", name)
		assert.Equal(t, "v1.36.3", n.Status.NodeInfo.KubeletVersion, "node %s kubelet version", name)
		assert.Contains(t, n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://2.", "node %s runtime", name)
		assert.Contains(t, n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: name})
	}
}

// A Pod with an emptyDir and a hostPath runs, writes both, is read back with
// kubectl exec, shows its output in kubectl logs, and leaves no mount when
// deleted.
func TestPodRunsWithEmptyDirAndHostPath(t *testing.T) {
	node := nodeByName(t, "127.0.0.2")
	hostDir := filepath.Join(env.runDir, "hostpath-"+strings.ToLower(t.Name()))
	require.NoError(t, os.MkdirAll(hostDir, 0o755))

	pod := workloadPod("volumes", node.Name, `echo started; echo scratch-data > /scratch/f; echo host-data > /host/f; sleep 3600`)
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir}}},
	}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}, {Name: "host", MountPath: "/host"}}
	created := createPod(t, pod)
	running := waitPodRunning(t, pod.Name)
	t.Logf("pod create→Running: %s", running.Sub(created).Round(time.Millisecond))

	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(hostDir, "f"))
		return err == nil && string(b) == "host-data\n"
	}, 30*time.Second, 200*time.Millisecond, "the Pod wrote the hostPath file")
	assert.Equal(t, "scratch-data", strings.TrimSpace(kubectl(t, "-n", podNamespace, "exec", pod.Name, "--", "cat", "/scratch/f")))
	assert.Equal(t, "started", strings.TrimSpace(kubectl(t, "-n", podNamespace, "logs", pod.Name)))

	uid := getPod(t, pod.Name).UID
	podDir := filepath.Join(node.KubeletRoot(), "pods", string(uid))
	require.NotEmpty(t, localcluster.MountsUnder(podDir), "the Pod's volumes (service account token) are mounted under %s", podDir)
	deletePod(t, pod.Name)
	assert.Eventually(t, func() bool { return len(localcluster.MountsUnder(podDir)) == 0 }, time.Minute, 200*time.Millisecond,
		"mounts left under %s: %v", podDir, localcluster.MountsUnder(podDir))
	assert.Eventually(t, func() bool { _, err := os.Stat(podDir); return os.IsNotExist(err) }, time.Minute,
		200*time.Millisecond, "the Pod's directory %s is removed", podDir)
}

func TestDaemonSetRunsOnEveryNode(t *testing.T) {
	labels := map[string]string{"app": "e2e-everywhere"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-everywhere", Namespace: podNamespace},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       workloadPod("", "", "sleep 3600").Spec,
			},
		},
	}
	ds.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways
	ds.Spec.Template.Spec.HostNetwork = true // as Strata's own node Pods will run
	ctx := context.Background()
	_, err := env.adminKube.AppsV1().DaemonSets(podNamespace).Create(ctx, ds, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.adminKube.AppsV1().DaemonSets(podNamespace).Delete(ctx, ds.Name, metav1.DeleteOptions{})
	})

	want := len(localcluster.DefaultNodeNames)
	require.Eventually(t, func() bool {
		got, err := env.adminKube.AppsV1().DaemonSets(podNamespace).Get(ctx, ds.Name, metav1.GetOptions{})
		return err == nil && got.Status.DesiredNumberScheduled == int32(want) && got.Status.NumberReady == int32(want)
	}, 2*time.Minute, 500*time.Millisecond, "DaemonSet Ready on every node")
	pods, err := env.adminKube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=e2e-everywhere"})
	require.NoError(t, err)
	onNodes := map[string]bool{}
	for _, p := range pods.Items {
		onNodes[p.Spec.NodeName] = true
	}
	for _, name := range localcluster.DefaultNodeNames {
		assert.True(t, onNodes[name], "a DaemonSet Pod on %s", name)
	}
}

// A kubelet killed with -9 and started again keeps its running Pods: same
// container, no restart, exec still works.
func TestKubeletKilledKeepsItsPods(t *testing.T) {
	node := nodeByName(t, "127.0.0.3")
	// A token the container writes once at start: the same token after the
	// restart means the same process kept running.
	pod := workloadPod("survivor", node.Name, "cat /proc/sys/kernel/random/uuid > /tmp/token; sleep 3600")
	createPod(t, pod)
	waitPodRunning(t, pod.Name)
	before := getPod(t, pod.Name).Status.ContainerStatuses[0]
	token := kubectl(t, "-n", podNamespace, "exec", pod.Name, "--", "cat", "/tmp/token")

	require.NoError(t, node.KillKubelet())
	require.NoError(t, node.StartKubelet())
	require.NoError(t, node.WaitReady(context.Background()))

	// The restarted kubelet reports the Pod again, from containerd's state.
	require.Eventually(t, func() bool {
		p := getPod(t, pod.Name)
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].Ready
	}, time.Minute, 500*time.Millisecond)
	after := getPod(t, pod.Name).Status.ContainerStatuses[0]
	assert.Equal(t, before.ContainerID, after.ContainerID, "the same container runs")
	assert.Zero(t, after.RestartCount)
	// The new kubelet serves exec once it has read the Pod back from the API
	// server, a moment after it is Ready.
	var out string
	var err error
	require.Eventually(t, func() bool {
		out, err = tryKubectl(t, "-n", podNamespace, "exec", pod.Name, "--", "cat", "/tmp/token")
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "exec after the restart: %v", err)
	assert.Equal(t, token, out, "the container that started before the kill still runs")
}

// workloadPod is a Pod of the workload image running script with sh.
func workloadPod(name, node, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           images.WorkloadRef,
				ImagePullPolicy: corev1.PullNever, // there is no registry
				Command:         []string{"sh", "-c", script},
			}},
		},
	}
}

func createPod(t *testing.T, pod *corev1.Pod) time.Time {
	t.Helper()
	start := time.Now()
	_, err := env.adminKube.CoreV1().Pods(podNamespace).Create(context.Background(), pod, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { deletePod(t, pod.Name) })
	return start
}

// waitPodRunning waits until every container of the Pod is ready and returns when.
func waitPodRunning(t *testing.T, name string) time.Time {
	t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true,
		func(ctx context.Context) (bool, error) {
			p, err := env.adminKube.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			last = p
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
	require.NoError(t, err, "pod %s Running; last status: %+v", name, last)
	return time.Now()
}

func getPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := env.adminKube.CoreV1().Pods(podNamespace).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return p
}

// deletePod deletes the Pod and waits until it is gone from the API.
func deletePod(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	err := env.adminKube.CoreV1().Pods(podNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := env.adminKube.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "pod %s deleted", name)
}

func nodeByName(t *testing.T, name string) *localcluster.Node {
	t.Helper()
	for _, n := range env.cluster.Nodes() {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no kubelet node %s", name)
	return nil
}
