// Package benchbackup (run by scripts/bench-backup) is a benchmark (not a
// test) of backups and restores through the real data plane to the real S3
// server (issue 15), each figure beside baselines measured in the same run:
//
//   - a volume of -size-mib (1 GiB) on -replicas replicas (one instance
//     manager each, the engine on the first) is filled with random data
//     over NBD and snapshotted; a full backup is timed through the instance
//     manager's SnapshotBackup; -change-percent of its 1 MiB blocks are
//     rewritten (random, aligned, spread over the volume), snapshotted, and
//     an incremental backup on the first is timed;
//   - both backups are restored into new volumes through BackupRestore
//     (frontend off), timed, and each restored volume is read back over NBD:
//     its SHA-256 must equal the source's at that snapshot;
//   - baselines: nbdcopy of the source volume's NBD export to a local file,
//     and raw PUT and GET of pack-sized objects (backupstore.DefaultPackSize,
//     as many as make the volume) to the same server through the same
//     client (backupstore.S3Store on minio-go), -concurrency at a time, as
//     the backup uploads and the restore fetches.
//
// Objects are counted by listing the bucket; requests by versitygw's own
// request log (one line a request), so the instance manager's requests are
// counted on the server, where no client-side wrapper can miss one. The raw
// PUT phase checks that the log saw every request it made.
//
//	make build && go run ./scripts/bench-backup -manager-bin bin/strata-manager
//
// Run it alone on a small machine (flock /tmp/strata-heavy.lock …). Needs
// nbdcopy (libnbd-bin); versitygw is built once by scripts/build-tools.sh.
// See docs/bench-backup.md.
package benchbackup

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
)

type config struct {
	managerBin    string
	sizeMiB       int
	changePercent int
	replicas      int
	concurrency   int
	dir           string
	runs          int
	keep          bool
}

func Main() {
	var cfg config
	flag.StringVar(&cfg.managerBin, "manager-bin", "", "strata-manager binary (required; make build writes bin/strata-manager)")
	flag.IntVar(&cfg.sizeMiB, "size-mib", 1024, "volume size, all of it random data")
	flag.IntVar(&cfg.changePercent, "change-percent", 10, "share of 1 MiB blocks rewritten before the incremental backup")
	flag.IntVar(&cfg.replicas, "replicas", 2, "replicas per volume, one instance manager each")
	flag.IntVar(&cfg.concurrency, "concurrency", 4, "backup/restore workers (backupstore's default) and raw S3 streams")
	flag.StringVar(&cfg.dir, "dir", os.TempDir(), "where the work directory goes (a real disk, not tmpfs)")
	flag.IntVar(&cfg.runs, "runs", 2, "runs of each baseline and restore, the best kept (backups run once: a second would dedupe)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the work directory (data, logs) at exit")
	flag.Parse()
	if cfg.managerBin == "" || cfg.sizeMiB < 1 || cfg.changePercent < 1 || cfg.changePercent > 100 ||
		cfg.replicas < 1 || cfg.replicas > 3 || cfg.concurrency < 1 || cfg.runs < 1 {
		flag.Usage()
		os.Exit(2)
	}
	log := logrus.New()
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05"})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, log, cfg)
	stop()
	if err != nil {
		log.WithError(err).Error("bench-backup failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, log *logrus.Logger, cfg config) (err error) {
	bin, err := filepath.Abs(cfg.managerBin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("-manager-bin: %w", err)
	}
	if err := os.MkdirAll(cfg.dir, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(cfg.dir, "strata-bench-backup-")
	if err != nil {
		return err
	}
	log.WithField("dir", work).Info("Work directory")
	e := &env{cfg: cfg, work: work, log: log, managerBin: bin}
	defer func() {
		err = errors.Join(err, e.close(err != nil))
	}()
	if err := e.start(ctx); err != nil {
		return err
	}
	res, err := e.measure(ctx)
	if err != nil {
		return err
	}
	res.print(os.Stdout)
	return nil
}

// measure runs every step in order; each returns its figures or the error
// that ends the run.
func (e *env) measure(ctx context.Context) (*results, error) {
	size := int64(e.cfg.sizeMiB) << 20
	res := &results{cfg: e.cfg, volumeBytes: size}
	data := filepath.Join(e.work, "data.bin")
	e.log.WithField("MiB", e.cfg.sizeMiB).Info("Writing random data")
	if err := writeRandom(data, size); err != nil {
		return nil, err
	}
	sum1, err := fileSHA256(data)
	if err != nil {
		return nil, err
	}

	src, err := e.createVolume(ctx, "src", size, "nbd")
	if err != nil {
		return nil, err
	}
	e.log.WithField("uri", src.FrontendEndpoint).Info("Filling the volume over NBD")
	if res.fill, err = e.timedNBDCopy(ctx, data, src.FrontendEndpoint); err != nil {
		return nil, err
	}
	// Baseline: the device to a local file. Its copy must hold the data,
	// or the volume does not hold what the backups are checked against.
	copyPath := filepath.Join(e.work, "nbdcopy.raw")
	e.log.Info("Baseline: nbdcopy of the volume to a local file")
	if res.nbdcopy, err = bestOf(e.cfg.runs, func() (phase, error) {
		p, err := e.timedNBDCopy(ctx, src.FrontendEndpoint, copyPath)
		if err != nil {
			return p, err
		}
		got, err := fileSHA256(copyPath)
		if err == nil && got != sum1 {
			err = fmt.Errorf("the volume read back over NBD has SHA-256 %s, the data written %s", got, sum1)
		}
		return p, errors.Join(err, os.Remove(copyPath))
	}); err != nil {
		return nil, err
	}

	if err := e.rawS3(ctx, data, res); err != nil {
		return nil, err
	}

	engine := src.Name
	if err := e.snapshot(ctx, engine, "s1"); err != nil {
		return nil, err
	}
	e.log.Info("Full backup of snapshot s1")
	if res.full, err = e.fullBackup(ctx, engine, "s1", "b1"); err != nil {
		return nil, err
	}

	changed, err := e.changeBlocks(ctx, data, src.FrontendEndpoint, size)
	if err != nil {
		return nil, err
	}
	res.changedChunks = int64(changed)
	sum2, err := fileSHA256(data)
	if err != nil {
		return nil, err
	}
	if got, err := e.volumeSHA256(ctx, src.FrontendEndpoint); err != nil {
		return nil, err
	} else if got != sum2 {
		return nil, fmt.Errorf("after rewriting %d blocks the volume has SHA-256 %s, the data written %s", changed, got, sum2)
	}
	if err := e.snapshot(ctx, engine, "s2"); err != nil {
		return nil, err
	}
	e.log.WithField("changedBlocks", changed).Info("Incremental backup of snapshot s2 on b1")
	if res.incr, err = e.backup(ctx, engine, "s2", "b2", "b1", "s1"); err != nil {
		return nil, err
	}
	// The incremental must have read only the rewritten blocks: more means
	// the layer map did not bound it, and its figures are not an
	// incremental's.
	if res.incr.status.ReadChunks != res.changedChunks {
		return nil, fmt.Errorf("incremental backup b2 read %d chunks, %d were rewritten", res.incr.status.ReadChunks, changed)
	}

	// The restores' own baseline, measured next to them: a fill of a fresh
	// volume now, with the page cache as the restores find it (the first
	// fill ran on an empty one, before gigabytes of other writes).
	e.log.Info("Baseline: a fill of a new volume, just before the restores")
	if res.lateFill, err = bestOf(e.cfg.runs, func() (phase, error) { return e.timedFill(ctx, data, "fill2", size) }); err != nil {
		return nil, err
	}
	e.log.Info("Restoring b1 and b2 into new volumes")
	st1, st2 := res.full.status, res.incr.status
	if res.restoreFull, err = bestOf(e.cfg.runs, func() (phase, error) {
		return e.restoreAndCheck(ctx, "b1", "src", "rest1", size, st1.DataChunks*st1.ChunkSize, sum1)
	}); err != nil {
		return nil, err
	}
	if res.restoreIncr, err = bestOf(e.cfg.runs, func() (phase, error) {
		return e.restoreAndCheck(ctx, "b2", "src", "rest2", size, st2.DataChunks*st2.ChunkSize, sum2)
	}); err != nil {
		return nil, err
	}
	res.when = time.Now()
	return res, nil
}

// timedFill times nbdcopy of data into a new volume, which it then deletes.
func (e *env) timedFill(ctx context.Context, data, name string, size int64) (phase, error) {
	v, err := e.createVolume(ctx, name, size, "nbd")
	if err != nil {
		return phase{}, err
	}
	p, err := e.timedNBDCopy(ctx, data, v.FrontendEndpoint)
	return p, errors.Join(err, e.deleteVolume(ctx, name))
}

// bestOf runs a timed step runs times and keeps the fastest: a first run
// may pay for memory or disk blocks the system never touched before, which
// on a small shared machine can cost more than the step itself.
func bestOf(runs int, fn func() (phase, error)) (phase, error) {
	var best phase
	for i := range runs {
		p, err := fn()
		if err != nil {
			return phase{}, err
		}
		if i == 0 || p.d < best.d {
			best = p
		}
	}
	return best, nil
}
