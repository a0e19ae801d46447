package benchscale

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/k8s/pkg/client/informers/externalversions"
	listers "github.com/strata-storage/strata/k8s/pkg/client/listers/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const (
	ns                 = types.DefaultNamespace
	nodeCount          = 3
	leaseDuration      = 10 * time.Second // as make run
	managerStopTimeout = 10 * time.Second // before SIGKILL
	// benchMarker marks a run directory as ours, so a later run may wipe it.
	benchMarker = "bench-scale.run"
	// stallTimeout is how long a wait may go without progress before the
	// bench gives up: waits have no fixed deadline because how long 30k
	// snapshots take is what is being measured.
	stallTimeout = 3 * time.Minute
)

// bench is one run: the cluster, the clients, and the figures so far.
type bench struct {
	cfg config
	log *logrus.Logger

	cluster *localcluster.Cluster
	opts    localcluster.ManagerOptions
	signer  *localcluster.Signer
	mu      sync.Mutex // guards managers, replaced by the cold restart
	mgrs    []*localcluster.Manager

	kube   kubernetes.Interface
	strata versioned.Interface
	// metrics reaches the managers' metrics ports (HTTPS, the admin's token).
	metrics *http.Client

	// The bench's own informers: waiting on thousands of objects by
	// polling Gets would itself load the API server being measured.
	volumes listers.VolumeLister
	snaps   *snapshotTracker
	// stopInformers ends the bench's watches; teardown calls it first, as
	// an open watch holds kube-apiserver's graceful shutdown to its timeout.
	stopInformers func()
	// While watchDetach is set, the volumes seen leaving "attached" are
	// recorded in leftAttached: a manager restart must not disturb them.
	watchDetach  atomic.Bool
	leftAttached sync.Map // volume name → struct{}
	leftLogged   atomic.Int64

	results []result
}

// setup starts the cluster exactly as make run does (scripts/run-local),
// waits until it is usable, and starts the bench's clients and informers.
func (b *bench) setup(ctx context.Context) error {
	if err := os.WriteFile(filepath.Join(b.cfg.runDir, benchMarker), nil, 0o644); err != nil {
		return err
	}
	root, err := localcluster.RepoRoot()
	if err != nil {
		return err
	}
	start := time.Now()
	b.cluster, err = localcluster.Start(ctx, localcluster.Options{Dir: b.cfg.runDir, Namespace: ns, Log: b.log})
	if err != nil {
		return err
	}
	if err := b.cluster.Install(ctx, root); err != nil {
		return err
	}
	// Each manager's token is bound to a bare Node of its name, which the
	// CA signer requires of its certificate requests.
	b.opts = localcluster.ManagerOptions{Bin: b.cfg.managerBin,
		NodeKubeconfig: b.cluster.NodeKubeconfigs(ns, types.ManagerServiceAccount), Namespace: ns,
		RunDir: b.cfg.runDir, LeaseDuration: leaseDuration, WithInstanceManager: true,
		// The rollout controller runs as in the chart: with no outdated
		// instance-manager Pod (none here) its queue must stay quiet too.
		InstanceManagerPods: "app=strata-instance-manager"}
	// The CA signer first: the managers wait for their certificates.
	signerKubeconfig, err := b.cluster.SignerKubeconfig(ctx, ns)
	if err != nil {
		return err
	}
	if b.signer, err = localcluster.StartSigner(b.opts.SignerOptions(signerKubeconfig)); err != nil {
		return err
	}
	b.log.WithFields(logrus.Fields{"pid": b.signer.Pid(), "log": b.signer.LogPath}).Info("CA signer started")
	var names []string
	for i := 1; i <= nodeCount; i++ {
		m, err := localcluster.StartManager(b.opts, "node-"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		b.mu.Lock()
		b.mgrs = append(b.mgrs, m)
		b.mu.Unlock()
		names = append(names, m.Node)
		b.log.WithFields(logrus.Fields{"node": m.Node, "pid": m.Pid(), "metrics": m.MetricsAddr,
			"instanceManager": m.IM.GRPCAddr, "log": m.LogPath}).Info("manager and instance manager started")
	}
	if err := b.cluster.WaitForNodesReady(ctx, ns, names, time.Minute); err != nil {
		return err
	}
	if b.metrics, err = b.cluster.ManagerMetricsClient(ctx, ns); err != nil {
		return err
	}
	if err := b.cluster.WaitForWebhooks(ctx, ns, time.Minute); err != nil {
		return err
	}
	if err := b.cluster.ApplyLocalSettings(ctx, ns); err != nil {
		return err
	}

	// The bench's writers must not be throttled by client-go: the figures
	// are about the managers, not about the bench's client.
	cfg := rest.CopyConfig(b.cluster.AdminConfig)
	cfg.QPS, cfg.Burst, cfg.UserAgent = 500, 1000, "strata-bench-scale"
	if b.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if b.strata, err = versioned.NewForConfig(cfg); err != nil {
		return err
	}
	if err := b.startInformers(ctx); err != nil {
		return err
	}
	b.log.WithField("took", time.Since(start).Round(time.Millisecond)).Info("local Strata is up")
	return nil
}

// startInformers watches volumes and snapshots for the rest of the run.
func (b *bench) startInformers(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	f := externalversions.NewSharedInformerFactoryWithOptions(b.strata, 0, externalversions.WithNamespace(ns))
	b.stopInformers = func() { cancel(); f.Shutdown() }
	vols := f.Strata().V1beta1().Volumes()
	b.volumes = vols.Lister()
	snapInf := f.Strata().V1beta1().Snapshots().Informer()
	b.snaps = newSnapshotTracker()
	if _, err := snapInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { b.snaps.observe(obj.(*v1beta1.Snapshot)) },
		UpdateFunc: func(_, obj any) { b.snaps.observe(obj.(*v1beta1.Snapshot)) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*v1beta1.Snapshot); ok {
				b.snaps.forget(s.Name)
			}
		},
	}); err != nil {
		return err
	}
	if _, err := vols.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*v1beta1.Volume), newObj.(*v1beta1.Volume)
			if b.watchDetach.Load() && o.Status.State == v1beta1.VolumeStateAttached &&
				n.Status.State != v1beta1.VolumeStateAttached {
				if _, seen := b.leftAttached.LoadOrStore(n.Name, struct{}{}); seen || b.leftLogged.Add(1) > 10 {
					return // the first ten are enough to show what happens
				}
				b.log.WithFields(logrus.Fields{"volume": n.Name, "state": n.Status.State,
					"robustness": n.Status.Robustness}).Warn("volume left attached")
			}
		},
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("bench informer for %v did not sync", typ)
		}
	}
	return nil
}

// managers returns the current manager processes.
func (b *bench) managers() []*localcluster.Manager {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*localcluster.Manager(nil), b.mgrs...)
}

// checkManagers fails when a manager, an instance manager or the CA signer
// exited on its own: the figures would be meaningless, and its log says why.
func (b *bench) checkManagers() error {
	var procs []*localcluster.Process
	if b.signer != nil {
		procs = append(procs, b.signer.Process)
	}
	for _, m := range b.managers() {
		procs = append(procs, m.Process, m.IM.Process)
	}
	for _, p := range procs {
		if p.Exited() {
			return fmt.Errorf("%s (pid %d) exited unexpectedly (%v); last lines of %s:\n%s",
				p.Name, p.Pid(), p.Err(), p.LogPath, p.LogTail(20))
		}
	}
	return nil
}

// teardown stops every manager, instance manager, the CA signer and the
// control plane (which deletes the managers' bare Nodes); Pdeathsig covers
// the case where the bench itself dies.
func (b *bench) teardown() {
	if b.stopInformers != nil {
		b.stopInformers()
	}
	var wg sync.WaitGroup
	for _, m := range b.managers() {
		wg.Go(func() {
			if err := m.StopAll(managerStopTimeout); err != nil {
				b.log.WithError(err).WithField("process", m.Name).Error("stopping manager")
			}
		})
	}
	wg.Wait()
	if b.signer != nil {
		if err := b.signer.Stop(managerStopTimeout); err != nil {
			b.log.WithError(err).Error("stopping the CA signer")
		}
	}
	if b.cluster != nil {
		if err := b.cluster.Stop(); err != nil {
			b.log.WithError(err).Error("stopping the control plane")
		}
		b.log.Info("managers and control plane stopped")
	}
}

// waitCount polls count every 100 ms (it reads the bench's informer cache,
// so polling costs the API server nothing) until it reaches total, logging
// progress every 10 s. It fails when the count has not moved for
// stallTimeout, or a manager died, with describe's account of what is
// missing.
func (b *bench) waitCount(ctx context.Context, what string, total int, count func() int, describe func() string) (time.Duration, error) {
	start := time.Now()
	lastMove, last := start, -1
	lastLog := start
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		n := count()
		if n >= total {
			return time.Since(start), nil
		}
		if n != last {
			last, lastMove = n, time.Now()
		}
		if time.Since(lastLog) >= 10*time.Second {
			b.log.WithFields(logrus.Fields{"done": n, "of": total, "elapsed": time.Since(start).Round(time.Second)}).Info(what)
			lastLog = time.Now()
		}
		if err := b.checkManagers(); err != nil {
			return 0, err
		}
		if time.Since(lastMove) > stallTimeout {
			return 0, fmt.Errorf("%s: stuck at %d of %d for %s; %s", what, n, total, stallTimeout, describe())
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}

// parallel runs fn(0..n-1) on `workers` goroutines and stops at the first
// error, which it returns.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range jobs {
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}
