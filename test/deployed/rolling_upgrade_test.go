package deployed

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
// keep the old image (their DaemonSets are OnDelete): replacing them is
// the admin's step, node by node (the chart's README).
func TestHelmUpgradeWhileAWriterRuns(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	claim(t, "upg-w", "")
	pod(t, "upg-w", "127.0.0.2", "upg-w", writer)
	waitWrites(t, "upg-w", 5, "from the start")

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
		want := upgradeRef
		if p.Labels["app"] == "strata-instance-manager" {
			want = images.StrataRef // OnDelete: not rolled
		}
		assert.Equal(t, want, p.Spec.Containers[0].Image, "pod %s", p.Name)
	}
	mgr := podOf(t, "strata-manager", "127.0.0.2")
	assert.Contains(t, kubectl(t, "-n", ns, "exec", mgr, "--", "/usr/local/bin/strata-manager", "--version"), upgradeVersion)
	t.Logf("%d chunks written and verified across the upgrade", stopAndVerify(t, "upg-w"))
}
