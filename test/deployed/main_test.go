// Package deployed tests Strata as users install it: the Helm chart on the
// local cluster's three kubelet nodes (what make run does), every component
// a Pod, driven with kubectl and helm. The process-mode suite (test/e2e)
// keeps the tests that kill processes by pid.
package deployed

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/internal/devtools/runlocal"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/test/suite"
	"github.com/strata-storage/strata/types"
)

const ns = types.DefaultNamespace

var env struct {
	cluster *localcluster.Cluster
	kube    kubernetes.Interface
	strata  versioned.Interface
	dynamic dynamic.Interface
	root    string
	bin     string // strata-manager
	nodes   []string
	chart   localcluster.ChartOptions // as installed
}

func TestMain(m *testing.M) {
	flag.Parse()
	suite.DefaultParallel(deployedParallel)
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deployed setup:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	log := logrus.New()
	runDir, err := os.MkdirTemp("", "strata-d-") // short: unix socket paths below it have 107 bytes
	if err != nil {
		return 0, err
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(runDir)
		}
	}()
	if env.root, err = localcluster.RepoRoot(); err != nil {
		return 0, err
	}
	if env.bin, err = localcluster.ManagerBinary(ctx, runDir); err != nil {
		return 0, err
	}
	clusterDir := filepath.Join(runDir, "cluster")
	baseline := localcluster.TakeHostBaseline()
	cluster, err := localcluster.Start(ctx, localcluster.Options{Dir: clusterDir, Namespace: ns, Log: log})
	if err != nil {
		return 0, err
	}
	env.cluster = cluster
	defer cluster.Stop()
	env.nodes = localcluster.DefaultNodeNames
	// Ports of their own: a make run on this machine holds the chart's.
	if env.chart, err = runlocal.ChartOptionsOnFreePorts(env.root); err != nil {
		return 0, err
	}
	if err := runlocal.StartChart(ctx, log, cluster, env.bin, env.nodes, env.chart); err != nil {
		return 0, err
	}
	env.kube = kubernetes.NewForConfigOrDie(cluster.AdminConfig)
	env.dynamic = dynamic.NewForConfigOrDie(cluster.AdminConfig)
	env.strata = versioned.NewForConfigOrDie(cluster.AdminConfig)

	code := m.Run()
	if code != 0 {
		keep = true
		fmt.Fprintf(os.Stderr, "deployed tests failed; the run directory stays: %s\n", runDir)
	}
	for _, reason := range cluster.StopLeavingNothing(clusterDir, baseline) {
		fmt.Fprintln(os.Stderr, reason)
		code = 1
	}
	return code, nil
}

// podLogs is the last lines of every Strata Pod's log, for a failed run.
func podLogs(ctx context.Context) string {
	var b strings.Builder
	out, _ := kubectlOut(ctx, "-n", ns, "get", "pods", "-o", "name")
	for _, pod := range strings.Fields(out) {
		logs, _ := kubectlOut(ctx, "-n", ns, "logs", pod, "--all-containers", "--tail=150")
		fmt.Fprintf(&b, "--- %s:\n%s\n", pod, logs)
	}
	return b.String()
}
