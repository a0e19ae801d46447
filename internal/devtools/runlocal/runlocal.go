// Package runlocal is `make run` (scripts/run-local runs Main): a local
// control plane with Strata's manifests installed, a real kubelet node per
// loopback address (kubelet + containerd + runc, images imported without a
// registry), one strata-manager per simulated node (with --processes: as
// processes, beside the CA signer), and a local S3 server
// (versitygw) as the default backup target, all as processes of this program,
// until SIGINT or SIGTERM; then it tears everything down, Pods and mounts
// included.
//
//	go run ./scripts/run-local --manager-bin bin/strata-manager
package runlocal

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/package/images"
)

const (
	managerStopTimeout = 10 * time.Second // before SIGKILL
	// defaultPollInterval is how often the local backup target is listed:
	// short, so backups made elsewhere show up while one tries things out.
	defaultPollInterval = time.Minute
	systemNamespace     = "strata-system"
	managerSA           = "strata-manager"
)

func Main() {
	managerBin := flag.String("manager-bin", "", "path to the strata-manager binary (required)")
	nodes := flag.Int("nodes", 3, "number of simulated nodes, one manager and one kubelet each")
	kubelets := flag.Bool("kubelets", true, "start a real kubelet node beside each manager (127.0.0.1, .2, …)")
	processes := flag.Bool("processes", false, "run the managers, instance managers and CSI plugins as host processes "+
		"(quick data-plane work) instead of installing the Helm chart onto the kubelet nodes")
	runDir := flag.String("run-dir", "", "run directory, wiped at start (default <repo>/.run)")
	verbose := flag.Bool("v", false, "debug logging")
	flag.Parse()

	log := logrus.New()
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05"})
	if *verbose {
		log.SetLevel(logrus.DebugLevel)
	}
	if *managerBin == "" || *nodes < 1 {
		flag.Usage()
		os.Exit(2)
	}
	if *kubelets && *nodes > 254 {
		log.Error("--nodes: at most 254 kubelet nodes (one loopback address each)")
		os.Exit(2)
	}
	if !*processes && !*kubelets {
		log.Error("--kubelets=false needs --processes: the chart's Pods run on the kubelet nodes")
		os.Exit(2)
	}
	if err := run(log, *managerBin, *runDir, *nodes, *kubelets, !*processes); err != nil {
		log.WithError(err).Error("run-local failed")
		os.Exit(1)
	}
}

func run(log *logrus.Logger, managerBin, runDir string, nodes int, kubelets, chart bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	bin, err := filepath.Abs(managerBin)
	if err != nil {
		return err
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("--manager-bin %s is not an executable file", managerBin)
	}
	root, err := localcluster.RepoRoot()
	if err != nil {
		return err
	}
	if runDir == "" {
		runDir = filepath.Join(root, ".run")
	}
	if runDir, err = filepath.Abs(runDir); err != nil {
		return err
	}
	// The CSI node plugin's registration socket is the deepest path under
	// the run directory; a unix socket path holds at most 107 bytes.
	if deepest := filepath.Join(runDir, "kubelets", "127.0.0.255", "kubelet", "plugins_registry", "driver.strata.io-reg.sock"); len(deepest) > 107 {
		return fmt.Errorf("--run-dir %s: too long by %d bytes for the unix sockets under it (such as %s); use a shorter path",
			runDir, len(deepest)-107, deepest)
	}
	unlock, err := lockRunDir(runDir)
	if err != nil {
		return err
	}
	defer unlock()
	// A run killed with -9 leaves Pods running and mounts under its node
	// directories; they go before the directory is emptied.
	if err := localcluster.TeardownNodes(runDir, log); err != nil {
		return fmt.Errorf("cleaning up the previous run's nodes: %w", err)
	}
	if err := wipe(runDir); err != nil {
		return err
	}

	start := time.Now()
	// The admin kubeconfig's context keeps the namespace default, as a
	// cluster's does: the README's claims and Pods are a user's, not
	// Strata's; Strata's own objects are addressed with -n strata-system.
	cluster, err := localcluster.Start(ctx, localcluster.Options{Dir: runDir, Log: log})
	if err != nil {
		return err
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			log.WithError(err).Error("stopping the control plane")
		}
		log.Info("control plane stopped")
	}()
	if chart {
		return runChart(ctx, stop, log, cluster, bin, root, runDir, nodes)
	}
	if err := cluster.Install(ctx, root); err != nil {
		return err
	}
	opts := managerOptions(cluster, bin, runDir)

	var kubeletNodes []string
	if kubelets {
		if kubeletNodes, err = startKubeletNodes(ctx, log, cluster, bin, nodes); err != nil {
			return err
		}
	}

	// The CA signer first: the managers wait for their certificates.
	signerKubeconfig, err := cluster.SignerKubeconfig(ctx, systemNamespace)
	if err != nil {
		return err
	}
	signer, err := localcluster.StartSigner(opts.SignerOptions(signerKubeconfig))
	if err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"pid": signer.Pid(), "log": signer.LogPath}).Info("CA signer started")
	defer func() {
		if signer != nil {
			stopSigner(log, signer)
		}
	}()
	managers, err := startManagers(log, opts, nodes)
	defer func() { stopManagers(log, managers) }()
	if err != nil {
		return err
	}
	// Up means usable: every node Ready and the admission webhooks answering.
	if err := cluster.WaitForNodesReady(ctx, systemNamespace, nodeNames(managers), time.Minute); err != nil {
		return err
	}
	if err := cluster.WaitForWebhooks(ctx, systemNamespace, time.Minute); err != nil {
		return err
	}
	if err := cluster.ApplyLocalSettings(ctx, systemNamespace); err != nil {
		return err
	}
	// Backups: a local S3 server and the default BackupTarget on it.
	s3, err := StartBackupTarget(ctx, log, cluster, root, runDir)
	if err != nil {
		return err
	}
	defer func() { _ = s3.Stop() }()
	if kubelets {
		// PVCs and VolumeSnapshots: the CSI driver and the upstream sidecars.
		if err := cluster.StartCSI(ctx, localcluster.CSIOptions{ManagerBin: bin, Namespace: systemNamespace,
			StrataNodes: nodeNames(managers), RepoRoot: root,
			InstanceManagerFileDir: opts.FUSEDir,
			FreezeSocket:           opts.FreezeSocket}); err != nil {
			return err
		}
		cluster.SuperviseCSI(log)
	}
	log.WithField("took", time.Since(start).Round(time.Millisecond)).Info("local Strata is up")

	printUsage(cluster, runDir, nodes, kubeletNodes, s3.Endpoint)

	// Crashed processes come back as the kubelet would bring back a
	// DaemonSet's Pods (and a Deployment's, the signer); restarts are
	// logged here and in the process's log.
	supervisors := make([]*localcluster.Supervisor, 0, len(managers))
	for _, m := range managers {
		supervisors = append(supervisors, localcluster.Supervise(log, opts, m))
	}
	signerSupervisor := localcluster.SuperviseSigner(log, signer)
	signer = nil // stopped with its supervisor
	<-ctx.Done()
	stop() // a second Ctrl-C now kills us at once; Pdeathsig takes the children along
	log.Info("stopping")
	stopSupervised(log, supervisors)
	managers = nil // stopped with their supervisors
	if err := signerSupervisor.Stop(managerStopTimeout); err != nil {
		log.WithError(err).Error("stopping the CA signer")
	}
	// The managers' bare Nodes go when the control plane stops (deferred).
	return nil
}

// stopSigner stops the CA signer; its defer comes before the managers', so
// it runs after they stopped.
func stopSigner(log logrus.FieldLogger, s *localcluster.Signer) {
	if err := s.Stop(managerStopTimeout); err != nil {
		log.WithError(err).Error("stopping the CA signer")
	}
}

// startKubeletNodes builds (or finds cached) the node images and starts a
// kubelet node per loopback address.
func startKubeletNodes(ctx context.Context, log logrus.FieldLogger, cluster *localcluster.Cluster, managerBin string,
	count int) ([]string, error) {
	imgs, err := images.BuildAll(ctx, images.Options{ManagerBin: managerBin, Log: log})
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, count)
	for i := 1; i <= count; i++ {
		names = append(names, fmt.Sprintf("127.0.0.%d", i))
	}
	if _, err := cluster.StartNodes(ctx, localcluster.NodeOptions{Names: names, ImageTars: images.Tars(imgs)}); err != nil {
		return nil, err
	}
	return names, nil
}

func printUsage(cluster *localcluster.Cluster, runDir string, nodes int, kubeletNodes []string, s3Endpoint string) {
	fmt.Printf(`
Strata runs locally: control plane + %d nodes (logs in %s).
In another shell:

    export KUBECONFIG=%s
    kubectl -n strata-system get nodes.strata.io
    kubectl -n strata-system get instancemanagers.strata.io
    kubectl -n strata-system get strata
`, nodes, filepath.Join(runDir, "logs"), cluster.AdminKubeconfig)
	if len(kubeletNodes) > 0 {
		fmt.Printf(`
Kubernetes nodes %v run real Pods (images: %s, %s):

    kubectl get nodes -o wide
    kubectl run hello --image=%s --restart=Never -- sh -c 'echo hello from $(hostname); sleep 3600'
    kubectl logs hello; kubectl exec hello -- ls /
    kubectl delete pod hello --grace-period=1

A PVC of the default StorageClass strata, used by a Pod (see README.md for
a VolumeSnapshot of it and a second Pod on a claim restored from that):

    kubectl apply -f - <<EOF
    apiVersion: v1
    kind: PersistentVolumeClaim
    metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}
    ---
    apiVersion: v1
    kind: Pod
    metadata: {name: app}
    spec:
      containers: [{name: app, image: %s, command: [sh, -c, 'date > /data/hello; sleep 3600'],
                    volumeMounts: [{name: data, mountPath: /data}]}]
      volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
    EOF
    kubectl get pvc,pod; kubectl exec app -- cat /data/hello
`, kubeletNodes, images.WorkloadRef, images.StrataRef, images.WorkloadRef, images.WorkloadRef)
	}
	fmt.Printf(`
Backups go to the local S3 server %s (bucket %s), the BackupTarget default:

    kubectl -n strata-system get bt
    kubectl -n strata-system apply -f - <<EOF
    apiVersion: strata.io/v1beta1
    kind: Backup
    metadata: {name: first, labels: {strata.io/volume: <a volume, e.g. the PV name of claim data>}}
    EOF
    kubectl -n strata-system get bk,bv

and come back as a new volume (or as claims of a StorageClass with the
parameter fromBackup: first), every day's snapshot kept for a week:

    kubectl -n strata-system apply -f - <<EOF
    apiVersion: strata.io/v1beta1
    kind: Volume
    metadata: {name: first-restored}
    spec: {size: 64Mi, numberOfReplicas: 2, fromBackup: first}
    ---
    apiVersion: strata.io/v1beta1
    kind: RecurringJob
    metadata: {name: daily}
    spec: {task: snapshot, cron: "0 3 * * *", retain: 7, groups: [default]}
    EOF
    kubectl -n strata-system get vol first-restored -o wide; kubectl -n strata-system get rj
`, s3Endpoint, backupBucket)
	fmt.Print("\nPress Ctrl-C to stop everything.\n\n")
}

// startManagers starts one manager per node, each with its own disk
// directory and metrics port, authenticated as the manager ServiceAccount
// with a token bound to its node's Node.
func startManagers(log logrus.FieldLogger, opts localcluster.ManagerOptions, nodes int) ([]*localcluster.Manager, error) {
	var managers []*localcluster.Manager
	for i := 1; i <= nodes; i++ {
		m, err := localcluster.StartManager(opts, "node-"+strconv.Itoa(i))
		if err != nil {
			return managers, err
		}
		managers = append(managers, m)
		log.WithFields(logrus.Fields{"node": m.Node, "pid": m.Pid(), "metrics": m.MetricsAddr, "log": m.LogPath,
			"instanceManager": m.IM.GRPCAddr, "nbd": m.IM.NBDSocket}).Info("manager and instance manager started")
	}
	return managers, nil
}

// managerOptions are the process-mode managers': each node's manager with
// its own kubeconfig, the manager ServiceAccount's token bound to a bare
// Node of its name (which the CA signer requires of its requests; the
// control plane's Stop deletes those Nodes).
func managerOptions(cluster *localcluster.Cluster, bin, runDir string) localcluster.ManagerOptions {
	return localcluster.ManagerOptions{Bin: bin, NodeKubeconfig: cluster.NodeKubeconfigs(systemNamespace, managerSA),
		Namespace: systemNamespace, RunDir: runDir, LeaseDuration: 10 * time.Second, WithInstanceManager: true, FUSEFiles: true}
}

// stopSupervised ends supervision and stops every node at once.
func stopSupervised(log logrus.FieldLogger, supervisors []*localcluster.Supervisor) {
	var wg sync.WaitGroup
	for _, s := range supervisors {
		wg.Go(func() {
			if err := s.StopAll(managerStopTimeout); err != nil {
				log.WithError(err).WithField("node", s.Manager().Node).Error("stopping node")
			}
		})
	}
	wg.Wait()
	log.WithField("managers", len(supervisors)).Info("managers stopped")
}

// stopManagers stops all managers at once, so shutdown takes one timeout at most.
func stopManagers(log logrus.FieldLogger, managers []*localcluster.Manager) {
	var wg sync.WaitGroup
	for _, m := range managers {
		wg.Go(func() {
			if err := m.StopAll(managerStopTimeout); err != nil {
				log.WithError(err).WithField("process", m.Name).Error("stopping manager")
			}
		})
	}
	wg.Wait()
	if len(managers) > 0 {
		log.WithField("managers", len(managers)).Info("managers stopped")
	}
}

// lockRunDir takes an exclusive lock on the run directory itself, so a second
// `make run` in the same checkout fails instead of wiping a live cluster.
func lockRunDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is in use by another run-local", dir)
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}

// wipe empties dir but keeps it, and with it the lock held on it.
func wipe(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func nodeNames(managers []*localcluster.Manager) []string {
	names := make([]string, 0, len(managers))
	for _, m := range managers {
		names = append(names, m.Node)
	}
	return names
}
