// Package e2e runs Strata end to end: a real control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler), three real
// kubelet nodes (containerd + runc), Strata's CRDs and shipped RBAC, one
// real strata-manager process per simulated node, authenticated as the
// manager ServiceAccount with a token bound to a bare Node of its name
// (localcluster's process nodes), and the CA signer (strata-manager
// ca-signer) as its own ServiceAccount. One cluster serves every test in the
// package; when it stops, nothing it made may be left on the host.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/package/images"
	"github.com/strata-storage/strata/test/suite"
	"github.com/strata-storage/strata/types"
)

// leaseDuration is short so a dead manager is noticed within seconds.
const leaseDuration = 3 * time.Second

// maxRetryDelay caps the managers' retry backoff.
const maxRetryDelay = 2 * time.Second

var nodeNames = []string{"node-1", "node-2", "node-3"}

// env is the shared cluster of the package's tests.
var env struct {
	cluster           *localcluster.Cluster
	runDir            string
	managerOpts       localcluster.ManagerOptions
	managers          map[string]*localcluster.Manager
	signer            *localcluster.Signer
	adminKube         kubernetes.Interface
	adminStrata       versioned.Interface
	managerConfig     *rest.Config
	managerKubeconfig string
}

// e2eParallel is how many of the package's parallel tests run at once: they
// mostly wait (for Pods, kubelets, uploads), so more than go test's default
// of one per core.
const e2eParallel = 16

func TestMain(m *testing.M) {
	flag.Parse()
	suite.DefaultParallel(e2eParallel)
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	log := logrus.New()

	runDir, err := os.MkdirTemp("", "strata-e2e-")
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

	root, err := localcluster.RepoRoot()
	if err != nil {
		return 0, err
	}
	bin, err := localcluster.ManagerBinary(ctx, runDir)
	if err != nil {
		return 0, err
	}

	clusterDir := filepath.Join(runDir, "cluster")
	baseline := localcluster.TakeHostBaseline()
	// The API server logs what Strata's components ask of it; after the
	// suite, auditCheck holds that against the shipped RBAC.
	cluster, err := localcluster.Start(ctx, localcluster.Options{Dir: clusterDir,
		Namespace: types.DefaultNamespace, Log: log, Audit: &auditOptions})
	if err != nil {
		return 0, err
	}
	env.cluster = cluster
	defer cluster.Stop()
	imgs, err := images.BuildAll(ctx, images.Options{ManagerBin: bin, Log: log})
	if err != nil {
		return 0, err
	}
	if _, err := cluster.StartNodes(ctx, localcluster.NodeOptions{Names: localcluster.DefaultNodeNames,
		ImageTars: images.Tars(imgs)}); err != nil {
		return 0, err
	}
	if err := cluster.Install(ctx, root); err != nil {
		return 0, err
	}
	// The manager ServiceAccount's token bound to no Node: the tests'
	// own probes of its RBAC use it. The managers' own are each bound to
	// their node's Node (NodeKubeconfig below).
	env.managerKubeconfig = filepath.Join(runDir, "manager.kubeconfig")
	if err := cluster.ServiceAccountKubeconfig(ctx, types.DefaultNamespace, types.ManagerServiceAccount, env.managerKubeconfig); err != nil {
		return 0, err
	}
	if env.managerConfig, err = clientcmd.BuildConfigFromFlags("", env.managerKubeconfig); err != nil {
		return 0, err
	}
	env.adminKube = kubernetes.NewForConfigOrDie(cluster.AdminConfig)
	env.adminStrata = versioned.NewForConfigOrDie(cluster.AdminConfig)

	env.managerOpts = localcluster.ManagerOptions{Bin: bin, Kubeconfig: env.managerKubeconfig,
		Namespace: types.DefaultNamespace, RunDir: runDir, LeaseDuration: leaseDuration, WithInstanceManager: true,
		FUSEFiles: true,
		// Short, so a test can see a key fail many times and then converge.
		MaxRetryDelay: maxRetryDelay,
		// The signer signs a manager's certificates only for the node its
		// token is bound to.
		NodeKubeconfig: cluster.NodeKubeconfigs(types.DefaultNamespace, types.ManagerServiceAccount)}
	// The CA signer first: it makes the CA, and the managers wait for
	// their certificates.
	signerKubeconfig, err := cluster.SignerKubeconfig(ctx, types.DefaultNamespace)
	if err != nil {
		return 0, err
	}
	if env.signer, err = localcluster.StartSigner(env.managerOpts.SignerOptions(signerKubeconfig)); err != nil {
		return 0, err
	}
	defer func() { _ = env.signer.Stop(10 * time.Second) }()
	env.managers = map[string]*localcluster.Manager{}
	defer func() {
		for _, mgr := range env.managers {
			_ = mgr.StopAll(10 * time.Second)
		}
	}()
	for _, n := range nodeNames {
		mgr, err := localcluster.StartManager(env.managerOpts, n)
		if err != nil {
			return 0, err
		}
		env.managers[n] = mgr
	}

	// Tests start on a usable cluster: every node Ready, webhooks answering.
	if err := cluster.WaitForNodesReady(ctx, types.DefaultNamespace, nodeNames, time.Minute); err != nil {
		// The run directory goes with a setup failure: say what the
		// managers and the signer said first.
		for _, mgr := range env.managers {
			fmt.Fprintf(os.Stderr, "--- manager %s (%s), last lines of %s:\n%s\n", mgr.Node, processState(mgr.Process),
				mgr.LogPath, mgr.LogTail(30))
		}
		fmt.Fprintf(os.Stderr, "--- CA signer (%s), last lines of %s:\n%s\n", processState(env.signer.Process),
			env.signer.LogPath, env.signer.LogTail(30))
		return 0, err
	}
	if err := cluster.WaitForWebhooks(ctx, types.DefaultNamespace, time.Minute); err != nil {
		return 0, err
	}
	// The disks are directories on the machine's shared filesystem, whose
	// free share moves with everything else on it (seen at 25% here); the
	// tests' volumes are tiny, so only a really full disk may stop them.
	if err := cluster.StartCSI(ctx, localcluster.CSIOptions{ManagerBin: bin, Namespace: types.DefaultNamespace,
		StrataNodes: nodeNames, RepoRoot: root, InstanceManagerFileDir: env.managerOpts.FUSEDir,
		FreezeSocket: env.managerOpts.FreezeSocket}); err != nil {
		return 0, err
	}
	if err := cluster.ApplyLocalSettings(ctx, types.DefaultNamespace); err != nil {
		return 0, err
	}
	if err := waitDisksSchedulable(ctx); err != nil {
		return 0, err
	}

	code := m.Run()
	for _, mgr := range env.managers {
		_ = mgr.StopAll(10 * time.Second)
	}
	_ = env.signer.Stop(10 * time.Second)
	// Why the suite failed outside its tests, said again after the
	// managers' log tails so that it is the last thing a reader sees.
	// Nothing the kubelet nodes made may outlive the suite.
	reasons := cluster.StopLeavingNothing(clusterDir, baseline)
	if len(reasons) > 0 {
		code = 1
	}
	// What the components asked of the API server against what their
	// roles grant. Judged only over a suite that passed (a failed test may
	// have stopped before using what it tests); after a failure the report
	// is still written beside the kept logs.
	if err := auditCheck(root, cluster.AuditLogPath, filepath.Join(runDir, "audit-report.txt"), code == 0); err != nil {
		reasons = append(reasons, err.Error())
		code = 1
	}
	if code != 0 {
		keep = true
		fmt.Fprintf(os.Stderr, "e2e failed; logs kept in %s\n", filepath.Join(runDir, "logs"))
		for _, mgr := range env.managers {
			fmt.Fprintf(os.Stderr, "--- last lines of %s:\n%s\n", mgr.LogPath, mgr.LogTail(30))
		}
		fmt.Fprintf(os.Stderr, "--- last lines of %s:\n%s\n", env.signer.LogPath, env.signer.LogTail(30))
		for _, r := range reasons {
			fmt.Fprintln(os.Stderr, r)
		}
	}
	return code, nil
}

// processState says whether p runs, or how it exited.
func processState(p *localcluster.Process) string {
	if p.Exited() {
		return fmt.Sprintf("exited: %v", p.Err())
	}
	return "running"
}

// waitDisksSchedulable waits until every node says a disk can take replicas.
func waitDisksSchedulable(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		nodes, err := env.adminStrata.StrataV1beta1().Nodes(types.DefaultNamespace).List(ctx, metav1.ListOptions{})
		if err != nil || len(nodes.Items) < len(nodeNames) {
			return false, nil
		}
		for _, n := range nodes.Items {
			if !meta.IsStatusConditionTrue(n.Status.Conditions, "Schedulable") {
				return false, nil
			}
		}
		return true, nil
	})
}
