package runlocal

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/package/images"
)

// runChart is make run's default: the kubelet nodes, then Strata installed
// onto them with its Helm chart, as an admin installs it on a cluster
// (every component a Pod), until ctx ends.
func runChart(ctx context.Context, stop context.CancelFunc, log logrus.FieldLogger, cluster *localcluster.Cluster,
	bin, root, runDir string, nodes int) error {
	start := time.Now()
	names := make([]string, 0, nodes)
	for i := 1; i <= nodes; i++ {
		names = append(names, fmt.Sprintf("127.0.0.%d", i))
	}
	if err := StartChart(ctx, log, cluster, bin, names, ChartOptions(root)); err != nil {
		return err
	}
	s3, err := StartBackupTarget(ctx, log, cluster, root, runDir)
	if err != nil {
		return err
	}
	defer func() { _ = s3.Stop() }()
	log.WithField("took", time.Since(start).Round(time.Millisecond)).Info("local Strata is up (Helm chart)")
	printUsage(cluster, runDir, nodes, names, s3.Endpoint)
	fmt.Printf("Strata runs in Pods: kubectl -n %s get pods -o wide\n", systemNamespace)
	fmt.Printf(`
The kubectl plugin (Strata's REST API with the kubeconfig's token):

    export PATH=$PATH:%s
    kubectl strata volume create scratch --size 64Mi --replicas 2
    kubectl strata snapshot create scratch first; kubectl strata snapshot ls scratch
    kubectl strata volume attach scratch --node 127.0.0.1 --keep   # Ctrl-C detaches
    kubectl strata quota set default 1Gi; kubectl strata quota show default

`, filepath.Dir(bin))
	<-ctx.Done()
	stop()
	log.Info("stopping: the nodes' teardown stops every Pod")
	return nil
}

// StartChart starts a kubelet node per name with every image the chart
// runs, installs the chart with opts and waits until Strata is usable: every
// Strata node Ready, the webhooks answering, the local settings applied and
// the disks taking replicas. make run and test/deployed start this way.
func StartChart(ctx context.Context, log logrus.FieldLogger, cluster *localcluster.Cluster, bin string,
	names []string, opts localcluster.ChartOptions) error {
	imgs, err := BuildChartImages(ctx, log, bin)
	if err != nil {
		return err
	}
	if _, err := cluster.StartNodes(ctx, localcluster.NodeOptions{Names: names, ImageTars: images.Tars(imgs)}); err != nil {
		return err
	}
	if err := cluster.InstallChart(ctx, opts); err != nil {
		return err
	}
	for _, step := range []func() error{
		func() error { return cluster.WaitForNodesReady(ctx, opts.Namespace, names, time.Minute) },
		func() error { return cluster.WaitForWebhooks(ctx, opts.Namespace, time.Minute) },
		func() error { return cluster.ApplyLocalSettings(ctx, opts.Namespace) },
		func() error { return cluster.WaitForNodesSchedulable(ctx, opts.Namespace, names, time.Minute) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// BuildChartImages builds (or finds cached) every image the chart runs on
// the local nodes: the pause and workload images, strata-manager's and the
// upstream sidecars' (built from their Go modules by build-tools.sh).
func BuildChartImages(ctx context.Context, log logrus.FieldLogger, managerBin string) ([]images.Image, error) {
	binDir, err := localcluster.BuildTools(ctx, log, localcluster.ChartSidecars...)
	if err != nil {
		return nil, err
	}
	sidecars := map[string]string{}
	for _, name := range localcluster.ChartSidecars {
		sidecars[name] = filepath.Join(binDir, name)
	}
	return images.BuildAll(ctx, images.Options{ManagerBin: managerBin, Log: log, Sidecars: sidecars})
}

// ChartOptions are the chart's local values: the images built here.
func ChartOptions(root string) localcluster.ChartOptions {
	refs := map[string]string{}
	for _, name := range localcluster.ChartSidecars {
		refs[name] = images.SidecarRef(name)
	}
	return localcluster.ChartOptions{RepoRoot: root, Namespace: systemNamespace, Image: images.StrataRef,
		SidecarImages: refs}
}

// ChartOptionsOnFreePorts is ChartOptions with the node ports (metrics,
// API, webhook, instance manager, SnapshotMetadata sidecar) on free ports
// of their own: for a test or bench cluster beside a make run that holds
// the chart's defaults.
func ChartOptionsOnFreePorts(root string) (localcluster.ChartOptions, error) {
	ports, err := localcluster.FreePorts(5)
	if err != nil {
		return localcluster.ChartOptions{}, err
	}
	opts := ChartOptions(root)
	opts.Values = map[string]any{"ports": map[string]any{"metrics": ports[0], "api": ports[1], "webhook": ports[2],
		"instanceManager": ports[3], "snapshotMetadata": ports[4]}}
	return opts, nil
}
