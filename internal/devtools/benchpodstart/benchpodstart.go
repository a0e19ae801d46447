// Package benchpodstart measures the time from `kubectl apply` of a claim
// and its Pod to the Pod running, step by step, on make run's cluster: a
// new claim, a claim restored from a VolumeSnapshot and a clone of a claim.
// Each step's time is when this program saw it through a watch; each CSI
// call's duration is read from the CSI processes' logs. What the kubelet
// waits between "attached" and "running", beyond the node calls, is its
// own (volume manager retries, container start).
//
//	go run ./scripts/bench-pod-start -run-local bin/run-local -manager-bin bin/strata-manager
package benchpodstart

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const benchNamespace = "bench-pod-start"

type config struct {
	runLocal, managerBin string
	samples              int
	keep                 bool
	size                 string
	fillMiB              int
}

// Main is scripts/bench-pod-start.
func Main() {
	var cfg config
	flag.StringVar(&cfg.runLocal, "run-local", "bin/run-local", "make run's program (make build makes it)")
	flag.StringVar(&cfg.managerBin, "manager-bin", "bin/strata-manager", "the strata-manager binary")
	flag.IntVar(&cfg.samples, "samples", 3, "Pods per kind of claim")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the run directory (logs) afterwards")
	flag.StringVar(&cfg.size, "size", "1Gi", "size of every claim")
	flag.IntVar(&cfg.fillMiB, "fill-mib", 64, "MiB the source claim's Pod writes (an init container) before it is snapshotted and cloned")
	flag.Parse()
	log := logrus.New()
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05"})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, cfg); err != nil {
		log.WithError(err).Error("bench-pod-start failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, log *logrus.Logger, cfg config) (err error) {
	if cfg.samples < 1 {
		return fmt.Errorf("-samples: at least 1, got %d", cfg.samples)
	}
	size, err := resource.ParseQuantity(cfg.size)
	if err != nil {
		return fmt.Errorf("-size: not a quantity such as 1Gi: %w", err)
	}
	if cfg.fillMiB < 0 || int64(cfg.fillMiB)<<20 > size.Value() {
		return fmt.Errorf("-fill-mib: between 0 and the claim's size, got %d", cfg.fillMiB)
	}
	runDir, err := os.MkdirTemp("", "bps-") // short: unix socket paths live under it
	if err != nil {
		return err
	}
	defer func() {
		if err == nil && !cfg.keep {
			_ = os.RemoveAll(runDir)
		} else {
			log.WithField("runDir", runDir).Info("run directory kept")
		}
	}()
	for _, p := range []*string{&cfg.runLocal, &cfg.managerBin} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	stopCluster, err := startRunLocal(ctx, log, cfg.runLocal, cfg.managerBin, runDir)
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := stopCluster(); stopErr != nil {
			log.WithError(stopErr).Warn("stopping run-local")
		}
	}()
	clusterDir := filepath.Join(runDir, "c")
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(clusterDir, "admin.kubeconfig"))
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 100, 200
	b := &bench{log: log, kube: kubernetes.NewForConfigOrDie(rc), dyn: dynamic.NewForConfigOrDie(rc),
		logsDir: filepath.Join(clusterDir, "logs"), size: size, fillMiB: cfg.fillMiB}
	results, err := b.runAll(ctx, cfg.samples)
	if err != nil {
		return err
	}
	fmt.Printf("\nclaims of %s; the source claim's Pod wrote %d MiB before the snapshot and the clones\n", cfg.size, cfg.fillMiB)
	printTable(os.Stdout, results)
	return nil
}

// runAll first starts the source claim's Pod (which fills it; not in the
// table), snapshots it, then measures samples Pods of each kind, one at a
// time: new claims, restores of the snapshot, clones of the source claim.
func (b *bench) runAll(ctx context.Context, samples int) ([]*sample, error) {
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	w, err := b.watch(ctx)
	if err != nil {
		return nil, err
	}
	src, err := b.measure(ctx, w, kindNew, sourceClaim)
	if err != nil {
		return nil, fmt.Errorf("the source claim: %w", err)
	}
	b.log.WithField("running", src.at(stepRunning).Round(time.Millisecond)).Info("Source Pod running (filled, not in the table)")
	if err := b.snapshotSource(ctx); err != nil {
		return nil, err
	}
	var out []*sample
	for _, kind := range []claimKind{kindNew, kindRestore, kindClone} {
		for i := 1; i <= samples; i++ {
			s, err := b.measure(ctx, w, kind, fmt.Sprintf("%s-%d", kindPrefix[kind], i))
			if err != nil {
				return nil, fmt.Errorf("%s %d: %w", kind, i, err)
			}
			b.log.WithFields(logrus.Fields{"kind": kind, "sample": i, "running": s.at(stepRunning).Round(time.Millisecond)}).Info("Pod running")
			out = append(out, s)
		}
	}
	return out, nil
}
