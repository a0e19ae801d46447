// Package benchscale (run by scripts/bench-scale) is a benchmark, not a test:
// on the local control plane with the real data plane (3 managers, 3 instance
// managers) it creates -volumes volumes with -snapshots snapshots each, then
// measures what it costs to keep that many objects: create and ReadyToUse
// times, a quiet window's workqueue adds, API server writes and instance-
// manager calls, snapshot create → ReadyToUse latency, manager memory, and a
// cold restart of every manager against the time a bare informer takes to list
// the same objects. It prints a table of figures against their targets and
// exits 0 even when a target is missed; non-zero means the bench itself could
// not run. See docs/bench-scale.md.
//
//	make build && go run ./scripts/bench-scale -manager-bin bin/strata-manager
package benchscale

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/resource"
)

// config is the command line.
type config struct {
	volumes, snapshots, replicas int
	clones                       int
	imageVolumes                 int
	backups, restores            int
	groups                       int
	size                         resource.Quantity
	workers                      int
	quiet                        time.Duration
	latencySamples               int
	quotaSamples                 int
	runDir, managerBin           string
}

func Main() {
	var cfg config
	var size string
	flag.IntVar(&cfg.volumes, "volumes", 1000, "number of volumes")
	flag.IntVar(&cfg.snapshots, "snapshots", 30, "snapshots per volume")
	flag.IntVar(&cfg.replicas, "replicas", 1, "replicas per volume (1-3)")
	flag.IntVar(&cfg.clones, "clones", 10, "volumes cloned from a snapshot before the quiet window")
	flag.IntVar(&cfg.imageVolumes, "image-volumes", 10, "volumes on a backing image (each attached once) before the quiet window")
	flag.IntVar(&cfg.backups, "backups", 50, "Backups of bench snapshots to a file:// target before the quiet window (0: no backup step)")
	flag.IntVar(&cfg.restores, "restores", 5, "volumes restored from those backups before the quiet window")
	flag.IntVar(&cfg.groups, "groups", 10, "SnapshotGroups of 2 volumes taken before the quiet window (0: no group step)")
	flag.StringVar(&size, "size", "4Mi", "volume size")
	flag.IntVar(&cfg.workers, "workers", 32, "concurrent API writers")
	flag.DurationVar(&cfg.quiet, "quiet", time.Minute, "length of the quiet window")
	flag.IntVar(&cfg.latencySamples, "latency-samples", 100, "snapshots timed one at a time from create to ReadyToUse")
	flag.IntVar(&cfg.quotaSamples, "quota-samples", 200, "dry-run snapshot creates timed through the quota admission check (0: no quota step)")
	flag.StringVar(&cfg.runDir, "run-dir", "", "run directory (default a new temp dir, removed unless the run fails or misses a target)")
	flag.StringVar(&cfg.managerBin, "manager-bin", "", "path to the strata-manager binary (required; make build writes bin/strata-manager)")
	verbose := flag.Bool("v", false, "debug logging")
	flag.Parse()

	log := logrus.New()
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05"})
	if *verbose {
		log.SetLevel(logrus.DebugLevel)
	}
	q, err := resource.ParseQuantity(size)
	if err != nil || q.Sign() <= 0 {
		fmt.Fprintf(os.Stderr, "-size %q: not a positive quantity\n", size)
		os.Exit(2)
	}
	cfg.size = q
	if cfg.managerBin == "" || cfg.volumes < 1 || cfg.snapshots < 0 || cfg.replicas < 1 || cfg.replicas > nodeCount ||
		cfg.workers < 1 || cfg.quiet <= 0 || cfg.latencySamples < 0 || cfg.quotaSamples < 0 ||
		cfg.backups < 0 || cfg.restores < 0 || cfg.groups < 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(log, cfg); err != nil {
		log.WithError(err).Error("bench-scale failed")
		os.Exit(1)
	}
}

func run(log *logrus.Logger, cfg config) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	bin, err := filepath.Abs(cfg.managerBin)
	if err != nil {
		return err
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("-manager-bin %s is not an executable file", cfg.managerBin)
	}
	cfg.managerBin = bin
	runDir, temp, err := prepareRunDir(cfg.runDir)
	if err != nil {
		return err
	}
	cfg.runDir = runDir
	log.WithField("runDir", runDir).Info("run directory (logs in logs/)")

	warnOpenFiles(log, cfg)

	b := &bench{cfg: cfg, log: log}
	// Registered first so it runs last, after every process has stopped.
	defer func() {
		switch {
		case err != nil || b.missed():
			log.WithField("logs", filepath.Join(runDir, "logs")).Info("run directory kept")
		case temp:
			if rmErr := os.RemoveAll(runDir); rmErr != nil {
				log.WithError(rmErr).Warn("removing the run directory")
			}
		}
	}()
	defer b.teardown()

	if err := b.setup(ctx); err != nil {
		return err
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"volumes", b.stepVolumes},
		{"snapshots", b.stepSnapshots},
		{"clones", b.stepClones},
		{"backing image", b.stepBackingImages},
		{"quota", b.stepQuota},
		{"backups", b.stepBackups},
		{"snapshot groups", b.stepGroups},
		{"quiet window", b.stepQuiet},
		{"snapshot latency", b.stepLatency},
		{"memory", b.stepMemory},
		{"cold restart", b.stepRestart},
	}
	for _, s := range steps {
		log.WithField("step", s.name).Info("---")
		if err := s.fn(ctx); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted during %s", s.name)
			}
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	b.printTable(os.Stdout)
	return nil
}

// prepareRunDir returns the run directory and whether it is a temp dir this
// run made. A directory given on the command line must be empty, missing, or
// a previous bench-scale run's (which is wiped): wiping an arbitrary
// directory a typo pointed at would be a bad surprise.
func prepareRunDir(dir string) (string, bool, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "strata-bench-scale-")
		return d, true, err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", false, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return dir, false, os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return "", false, err
	}
	if len(entries) == 0 {
		return dir, false, nil
	}
	if _, err := os.Stat(filepath.Join(dir, benchMarker)); err != nil {
		return "", false, fmt.Errorf("-run-dir %s is not empty and not a previous bench-scale run directory", dir)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return "", false, err
		}
	}
	return dir, false, nil
}

// warnOpenFiles warns when one instance manager could run out of file
// descriptors: it keeps every layer file of its replicas open (one per
// snapshot, plus the head and a listener), and on the local cluster every
// disk shares one filesystem, so the scheduler may put most replicas on one
// node. Instance managers inherit this process's hard limit.
func warnOpenFiles(log logrus.FieldLogger, cfg config) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	need := uint64(cfg.volumes*cfg.replicas) * uint64(cfg.snapshots+2)
	if need > lim.Max/2 {
		log.WithFields(logrus.Fields{"worstCaseFilesOnOneNode": need, "hardLimit": lim.Max}).
			Warn("an instance manager holding most replicas may run out of open files; raise ulimit -Hn")
	}
}
