package conformance

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/internal/devtools/runlocal"
	"github.com/strata-storage/strata/package/images"
	"github.com/strata-storage/strata/types"
)

// RunEnv asks for the run: without it (make test, go test ./...) no cluster
// starts and TestExternalStorage skips. make test-conformance sets it.
const RunEnv = "STRATA_CONFORMANCE"

var env struct {
	cluster *localcluster.Cluster
	root    string // the strata checkout
	runDir  string
	binDir  string // e2e.test and ginkgo
	timings []timing
}

// timing is one setup step's wall time, printed with the results.
type timing struct {
	step string
	took time.Duration
}

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(RunEnv) == "" {
		os.Exit(m.Run())
	}
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance setup:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// run builds the suite, starts the local cluster with the Helm chart as
// test/deployed does, adds the suite's images and the pod-directory links,
// runs the tests and checks that teardown left nothing on the host.
func run(m *testing.M) (int, error) {
	log := logrus.New()
	var err error
	if env.root, err = localcluster.RepoRoot(); err != nil {
		return 0, err
	}
	// Built before the cluster starts, apart: about 11 minutes cold, which
	// no cluster should wait through.
	step := time.Now()
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 45*time.Minute)
	env.binDir, err = localcluster.BuildTools(buildCtx, log, "conformance")
	cancelBuild()
	if err != nil {
		return 0, err
	}
	env.timings = append(env.timings, timing{"e2e.test and ginkgo found or built (build-tools.sh conformance)", time.Since(step)})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	runDir, err := os.MkdirTemp("", "strata-c-") // short: unix socket paths below it have 107 bytes
	if err != nil {
		return 0, err
	}
	env.runDir = runDir
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(runDir)
		}
	}()
	step = time.Now()
	bin, err := localcluster.ManagerBinary(ctx, runDir)
	if err != nil {
		return 0, err
	}
	clusterDir := filepath.Join(runDir, "cluster")
	baseline := localcluster.TakeHostBaseline()
	cluster, err := localcluster.Start(ctx, localcluster.Options{Dir: clusterDir, Namespace: types.DefaultNamespace, Log: log})
	if err != nil {
		return 0, err
	}
	env.cluster = cluster
	defer cluster.Stop()
	chart, err := runlocal.ChartOptionsOnFreePorts(env.root) // a make run may hold the default ports
	if err != nil {
		return 0, err
	}
	if err := runlocal.StartChart(ctx, log, cluster, bin, localcluster.DefaultNodeNames, chart); err != nil {
		return 0, err
	}
	env.timings = append(env.timings, timing{"cluster and chart (3 kubelet nodes, Strata Ready)", time.Since(step)})

	step = time.Now()
	imgs, err := images.BuildE2E(ctx, images.Options{Log: log, RepoDir: env.root})
	if err != nil {
		return 0, err
	}
	if err := cluster.ImportImages(ctx, images.Tars(imgs)); err != nil {
		return 0, err
	}
	env.timings = append(env.timings, timing{"e2e images built and imported", time.Since(step)})

	var roots []string
	for _, n := range cluster.Nodes() {
		roots = append(roots, n.KubeletRoot())
	}
	links, err := StartPodDirLinks(KubeletPodsDir, roots, 200*time.Millisecond)
	if err != nil {
		return 0, err
	}

	code := m.Run()
	_, made := links.Links()
	fmt.Printf("pod-directory links under %s made during the run: %d\n", KubeletPodsDir, made)
	if err := links.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "removing the pod-directory links:", err)
		code = 1
	}
	if code != 0 {
		keep = true
		fmt.Fprintf(os.Stderr, "conformance run failed; the run directory stays: %s\n", runDir)
	}
	for _, reason := range cluster.StopLeavingNothing(clusterDir, baseline) {
		fmt.Fprintln(os.Stderr, reason)
		code = 1
	}
	return code, nil
}
