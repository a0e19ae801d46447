package deployed

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/package/images"
)

// upgradeRef is the image helm upgrade moves to: the same code built with
// another version string.
const (
	upgradeRef     = "localhost/strata/strata-manager:upgrade-test"
	upgradeVersion = "upgrade-test"
)

// helm upgrade to a new image while a Pod writes to its claim: the
// managers, CSI node plugins and CSI controller roll to it, no write
// fails, and every acknowledged write reads back. The instance managers
// (OnDelete DaemonSets) of the nodes holding the claim's engine or
// replicas keep the old image while it is attached, their InstanceManager
// saying why (UpToDate false, VolumesInUse); once the claim is gone every
// node's manager replaces its instance manager, one node after another.
func TestHelmUpgradeWhileAWriterRuns(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	claim(t, "upg-w", "")
	pod(t, "upg-w", "127.0.0.2", "upg-w", writer)
	waitWrites(t, "upg-w", 5, "from the start")
	volume := volumeOfClaim(t, "upg-w")
	inUse := nodesOfVolume(t, volume)
	oldIMPods := map[string]string{}
	for _, node := range inUse {
		oldIMPods[node] = podOf(t, "strata-instance-manager", node)
	}

	bin := filepath.Join(t.TempDir(), "strata-manager")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/strata-storage/strata/app.Version="+upgradeVersion,
		"-o", bin, ".")
	build.Dir = env.root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	imgs, err := images.BuildAll(ctx, images.Options{ManagerBin: bin, StrataRef: upgradeRef, Log: logrus.New()})
	require.NoError(t, err)
	var tars []string
	for _, img := range imgs {
		if img.Ref == upgradeRef {
			tars = append(tars, img.Tar)
		}
	}
	require.Len(t, tars, 1)
	require.NoError(t, env.cluster.ImportImages(ctx, tars))

	chart := env.chart
	chart.Image = upgradeRef
	start := time.Now()
	require.NoError(t, env.cluster.InstallChart(ctx, chart), "helm upgrade")
	t.Logf("helm upgrade (--wait) took %s", time.Since(start).Round(time.Millisecond))
	waitWrites(t, "upg-w", 10, "after the upgrade")

	pods, err := env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, p := range pods.Items {
		if p.Labels["app"] != "strata-instance-manager" {
			assert.Equal(t, upgradeRef, p.Spec.Containers[0].Image, "pod %s", p.Name)
		}
	}
	for _, node := range inUse {
		assert.Equal(t, oldIMPods[node], podOf(t, "strata-instance-manager", node),
			"the instance manager of %s, which the attached volume uses, is not replaced", node)
		waitUpToDate(t, node, metav1.ConditionFalse, "VolumesInUse", volume)
	}
	mgr := podOf(t, "strata-manager", "127.0.0.2")
	assert.Contains(t, kubectl(t, "-n", ns, "exec", mgr, "--", "/usr/local/bin/strata-manager", "--version"), upgradeVersion)
	t.Logf("%d chunks written and verified across the upgrade", stopAndVerify(t, "upg-w"))

	kubectl(t, "-n", podNamespace, "delete", "pod", "upg-w", "--grace-period=1")
	kubectl(t, "-n", podNamespace, "delete", "pvc", "upg-w", "--wait=false")
	start = time.Now()
	require.Eventually(t, func() bool {
		pods, err := env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=strata-instance-manager"})
		if err != nil || len(pods.Items) != len(env.nodes) {
			return false
		}
		for _, p := range pods.Items {
			if p.Spec.Containers[0].Image != upgradeRef || !podReady(&p) {
				return false
			}
		}
		return true
	}, 3*time.Minute, 250*time.Millisecond, "every node's manager replaces its instance manager once the claim is gone")
	t.Logf("instance managers on the new image %s after the claim was deleted", time.Since(start).Round(time.Millisecond))
	for _, node := range env.nodes {
		waitUpToDate(t, node, metav1.ConditionTrue, "NewestRevision", "")
	}
}

// nodesOfVolume lists the nodes holding volume's engine or replicas.
func nodesOfVolume(t *testing.T, volume string) []string {
	t.Helper()
	var nodes []string
	engines, err := env.strata.StrataV1beta1().Engines(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	for _, e := range engines.Items {
		if e.Spec.VolumeName == volume {
			nodes = append(nodes, e.Spec.NodeID)
		}
	}
	replicas, err := env.strata.StrataV1beta1().Replicas(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	for _, r := range replicas.Items {
		if r.Spec.VolumeName == volume {
			nodes = append(nodes, r.Spec.NodeID)
		}
	}
	return uniq(nodes...)
}

// waitUpToDate waits for node's InstanceManager's UpToDate condition.
func waitUpToDate(t *testing.T, node string, status metav1.ConditionStatus, reason, inMessage string) {
	t.Helper()
	var last string
	ok := assert.Eventually(t, func() bool {
		im, err := env.strata.StrataV1beta1().InstanceManagers(ns).Get(context.Background(), "im-"+node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		cond := meta.FindStatusCondition(im.Status.Conditions, v1beta1.ConditionTypeUpToDate)
		if cond == nil {
			return false
		}
		last = fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)
		return cond.Status == status && cond.Reason == reason && strings.Contains(cond.Message, inMessage)
	}, time.Minute, 250*time.Millisecond)
	require.True(t, ok, "im-%s UpToDate %s %s (naming %q); it says %s", node, status, reason, inMessage, last)
	t.Logf("im-%s UpToDate: %s", node, last)
}
