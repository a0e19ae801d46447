package runlocal

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/internal/localcluster"
	"github.com/strata-storage/strata/package/images"
)

// runChart is make run's default: the kubelet nodes, then Strata installed
// onto them with its Helm chart, as an admin installs it on a cluster
// (every component a Pod), until ctx ends.
func runChart(ctx context.Context, stop context.CancelFunc, log logrus.FieldLogger, cluster *localcluster.Cluster,
	bin, root, runDir string, nodes int) error {
	start := time.Now()
	imgs, err := BuildChartImages(ctx, log, bin)
	if err != nil {
		return err
	}
	names := make([]string, 0, nodes)
	for i := 1; i <= nodes; i++ {
		names = append(names, fmt.Sprintf("127.0.0.%d", i))
	}
	if _, err := cluster.StartNodes(ctx, localcluster.NodeOptions{Names: names, ImageTars: images.Tars(imgs)}); err != nil {
		return err
	}
	if err := cluster.InstallChart(ctx, ChartOptions(root)); err != nil {
		return err
	}
	// Up means usable: every Strata node Ready and the webhooks answering.
	if err := cluster.WaitForNodesReady(ctx, systemNamespace, names, time.Minute); err != nil {
		return err
	}
	if err := cluster.WaitForWebhooks(ctx, systemNamespace, time.Minute); err != nil {
		return err
	}
	if err := cluster.ApplyLocalSettings(ctx, systemNamespace); err != nil {
		return err
	}
	if err := cluster.WaitForNodesSchedulable(ctx, systemNamespace, names, time.Minute); err != nil {
		return err
	}
	s3, err := StartBackupTarget(ctx, log, cluster, root, runDir)
	if err != nil {
		return err
	}
	defer func() { _ = s3.Stop() }()
	log.WithField("took", time.Since(start).Round(time.Millisecond)).Info("local Strata is up (Helm chart)")
	printUsage(cluster, runDir, nodes, names, s3.Endpoint)
	fmt.Printf("Strata runs in Pods: kubectl -n %s get pods -o wide\n\n", systemNamespace)
	<-ctx.Done()
	stop()
	log.Info("stopping: the nodes' teardown stops every Pod")
	return nil
}

// BuildChartImages builds (or finds cached) every image the chart runs on
// the local nodes: the pause and workload images, strata-manager's and the
// upstream sidecars' (built from their Go modules by build-tools.sh).
func BuildChartImages(ctx context.Context, log logrus.FieldLogger, managerBin string) ([]images.Image, error) {
	binDir, err := localcluster.BuildTools(ctx, log, localcluster.CSISidecars...)
	if err != nil {
		return nil, err
	}
	sidecars := map[string]string{}
	for _, name := range localcluster.CSISidecars {
		sidecars[name] = filepath.Join(binDir, name)
	}
	return images.BuildAll(ctx, images.Options{ManagerBin: managerBin, Log: log, Sidecars: sidecars})
}

// ChartOptions are the chart's local values: the images built here.
func ChartOptions(root string) localcluster.ChartOptions {
	refs := map[string]string{}
	for _, name := range localcluster.CSISidecars {
		refs[name] = images.SidecarRef(name)
	}
	return localcluster.ChartOptions{RepoRoot: root, Namespace: systemNamespace, Image: images.StrataRef,
		SidecarImages: refs}
}
