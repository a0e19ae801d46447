// Package benchkbench is a kbench-style benchmark of what a Pod gets from
// Strata (scripts/bench-kbench, docs/bench-kbench.md): the same fio jobs
// in a Pod on a hostPath directory of the disk Strata's replicas live on
// (the local-path baseline), on the raw NBD export of a Strata volume,
// and in Pods on Strata claims (1 and 3 replicas, ext4 and block mode), on
// the local cluster with the Helm chart installed, as make run starts it.
// Every figure is printed with its ratio to the baseline of the same run.
package benchkbench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/internal/devtools/runlocal"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/package/images"
	"github.com/strata-storage/strata/types"
)

type config struct {
	managerBin string
	runtime    time.Duration
	fileSize   string
	out        string
	only       string
	// fioCPU and imCPU are CPU requests (Kubernetes quantities) for the
	// fio Pods and the instance managers; empty: none for fio (BestEffort,
	// as kbench runs it) and the chart's for the instance managers.
	fioCPU, imCPU string
	// dataLocality is the claims' StorageClass parameter.
	dataLocality string
}

// Main runs the benchmark and prints the table; its exit status is 0
// unless the benchmark itself fails.
func Main() {
	var cfg config
	flag.StringVar(&cfg.managerBin, "manager-bin", "", "strata-manager binary (default: built from this checkout)")
	flag.DurationVar(&cfg.runtime, "runtime", 10*time.Second, "duration of each fio job (plus 2 s of ramp)")
	flag.StringVar(&cfg.fileSize, "size", "512M", "fio's file or device span per target (claims are twice as large)")
	flag.StringVar(&cfg.out, "out", "", "also write the Markdown table to this file")
	flag.StringVar(&cfg.only, "only", "", "comma-separated target names to run (default all; the baseline always runs)")
	flag.StringVar(&cfg.fioCPU, "fio-cpu", "", "CPU request of the fio Pods, e.g. 500m (default none: BestEffort)")
	flag.StringVar(&cfg.imCPU, "im-cpu", "", "CPU request of the instance-manager Pods (default the chart's)")
	flag.StringVar(&cfg.dataLocality, "data-locality", "best-effort",
		"the claims' dataLocality (best-effort: a replica on the Pod's node before fio starts; disabled: wherever it was scheduled)")
	flag.Parse()
	for name, q := range map[string]string{"-fio-cpu": cfg.fioCPU, "-im-cpu": cfg.imCPU} {
		if _, err := resource.ParseQuantity(q); q != "" && err != nil {
			fmt.Fprintf(os.Stderr, "%s %q: %v\n", name, q, err)
			os.Exit(2)
		}
	}
	log := logrus.New()
	// Ctrl-C or a kill ends the run through its cleanups: the cluster's
	// processes, mounts and loop devices outlive a process that just dies.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, log, cfg)
	stop()
	if err != nil {
		log.WithError(err).Error("bench-kbench failed")
		os.Exit(1)
	}
}

// bench is a running cluster with Strata installed.
type bench struct {
	cfg     config
	log     logrus.FieldLogger
	cluster *localcluster.Cluster
	kube    kubernetes.Interface
	strata  versioned.Interface
	node    string // where every fio runs
}

func run(ctx context.Context, log *logrus.Logger, cfg config) error {
	root, err := localcluster.RepoRoot()
	if err != nil {
		return err
	}
	runDir, err := os.MkdirTemp("", "strata-kb-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(runDir)
	if cfg.managerBin == "" {
		if cfg.managerBin, err = localcluster.ManagerBinary(ctx, runDir); err != nil {
			return err
		}
	}
	fio, err := images.BuildFio(ctx, images.Options{Log: log})
	if err != nil {
		return err
	}
	clusterDir := filepath.Join(runDir, "cluster")
	baseline := localcluster.TakeHostBaseline()
	cluster, err := localcluster.Start(ctx, localcluster.Options{Dir: clusterDir, Namespace: types.DefaultNamespace, Log: log})
	if err != nil {
		return err
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			log.WithError(err).Warn("Stopping the cluster")
		}
		if residue := localcluster.HostResidue(clusterDir, baseline); len(residue) > 0 {
			log.WithField("residue", residue).Warn("Left on the host after the cluster stopped")
		}
	}()
	chart, err := runlocal.ChartOptionsOnFreePorts(root)
	if err != nil {
		return err
	}
	if cfg.imCPU != "" {
		chart.Values["instanceManager"] = map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": cfg.imCPU}}}
	}
	if err := runlocal.StartChart(ctx, log, cluster, cfg.managerBin, localcluster.DefaultNodeNames, chart); err != nil {
		return err
	}
	if err := cluster.ImportImages(ctx, []string{fio.Tar}); err != nil {
		return err
	}
	b := &bench{cfg: cfg, log: log, cluster: cluster, node: localcluster.DefaultNodeNames[0],
		kube: kubernetes.NewForConfigOrDie(cluster.AdminConfig), strata: versioned.NewForConfigOrDie(cluster.AdminConfig)}
	if err := b.setUp(ctx); err != nil {
		return err
	}
	start := time.Now()
	targets, err := b.measureAll(ctx)
	if err != nil {
		return err
	}
	var table strings.Builder
	fmt.Fprintf(&table, "kbench-style suite, %d cores, fio %s per target, each job %s + 2 s ramp, all on node %s; "+
		"claims and volumes with dataLocality %s; ratios to %s of the same run (latency: lower is better)\n\n",
		numCPU(), cfg.fileSize, cfg.runtime, b.node, cfg.dataLocality, targets[0].name)
	writeTable(&table, targets)
	fmt.Fprintf(&table, "\nmeasured in %s\n", time.Since(start).Round(time.Second))
	fmt.Print("\n" + table.String())
	if cfg.out != "" {
		return os.WriteFile(cfg.out, []byte(table.String()), 0o644)
	}
	return nil
}

// measureAll runs fio on every target in turn, the baseline first.
func (b *bench) measureAll(ctx context.Context) ([]target, error) {
	all := []struct {
		name string
		run  func(context.Context) (figures, error)
	}{
		{"local-path (hostPath)", b.localPath},
		{"raw NBD, 1 replica", func(ctx context.Context) (figures, error) { return b.rawNBD(ctx, 1, false) }},
		{"raw NBD from the host, 1 replica", func(ctx context.Context) (figures, error) { return b.rawNBD(ctx, 1, true) }},
		{"ext4, 1 replica", func(ctx context.Context) (figures, error) { return b.claim(ctx, 1, false) }},
		{"block, 1 replica", func(ctx context.Context) (figures, error) { return b.claim(ctx, 1, true) }},
		{"ext4 from the host, 1 replica", func(ctx context.Context) (figures, error) { return b.ext4FromHost(ctx, 1) }},
		{"raw NBD, 3 replicas", func(ctx context.Context) (figures, error) { return b.rawNBD(ctx, 3, false) }},
		{"ext4, 3 replicas", func(ctx context.Context) (figures, error) { return b.claim(ctx, 3, false) }},
		{"block, 3 replicas", func(ctx context.Context) (figures, error) { return b.claim(ctx, 3, true) }},
	}
	var out []target
	for i, t := range all {
		if i > 0 && b.cfg.only != "" && !strings.Contains(","+b.cfg.only+",", ","+t.name+",") {
			continue
		}
		b.log.WithField("target", t.name).Info("Measuring")
		f, err := t.run(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.name, err)
		}
		b.log.WithFields(logrus.Fields{"target": t.name, "figures": fmt.Sprintf("%+v", f)}).Info("Measured")
		out = append(out, target{name: t.name, figures: f})
	}
	return out, nil
}
