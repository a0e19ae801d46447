package benchbackup

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/internal/devtools/benchvol"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/internal/devtools/s3server"
	"github.com/strata-storage/strata/internal/pki"
)

const (
	bucket = "bench"
	region = "us-east-1"
	// targetPrefix holds the backups; the raw baseline's objects go
	// elsewhere in the bucket so they are never counted as the backups'.
	targetPrefix = "backups"
	rawPrefix    = "raw"
	// pollEvery is how often a job's status is read: small next to the
	// seconds a job takes, so it adds little to the times measured.
	pollEvery = 20 * time.Millisecond
)

// env is what one run starts: the S3 server, the instance managers and
// clients to them, all under work.
type env struct {
	cfg        config
	work       string
	managerBin string
	log        *logrus.Logger

	s3      *s3server.Server
	store   *backupstore.S3Store // the backup target's prefix
	raw     *backupstore.S3Store // the raw baseline's prefix
	ims     []*localcluster.InstanceManager
	clients []*engineapi.Client
}

func (e *env) start(ctx context.Context) error {
	root, err := localcluster.RepoRoot()
	if err != nil {
		return err
	}
	bin, err := s3server.Binary(ctx, root)
	if err != nil {
		return err
	}
	if e.s3, err = s3server.Start(bin, filepath.Join(e.work, "s3")); err != nil {
		return err
	}
	cfg := backupstore.S3Config{Endpoint: e.s3.Endpoint, Bucket: bucket, Region: region, Prefix: targetPrefix,
		AccessKey: e.s3.AccessKey, SecretKey: e.s3.SecretKey}
	if e.store, err = backupstore.NewS3Store(cfg); err != nil {
		return err
	}
	cfg.Prefix = rawPrefix
	if e.raw, err = backupstore.NewS3Store(cfg); err != nil {
		return err
	}
	if err := e.store.MakeBucket(ctx); err != nil {
		return fmt.Errorf("making bucket %s: %w", bucket, err)
	}
	e.log.WithField("endpoint", e.s3.Endpoint).Info("S3 server started")

	// Every node's replicas go under one directory (see create below).
	opts := localcluster.ManagerOptions{Bin: e.managerBin, RunDir: e.work, ExtraDiskPaths: []string{e.diskDir()}}
	// No managers here: the bench plays their part for the certificates.
	ca, err := pki.NewAuthority()
	if err != nil {
		return err
	}
	manager, err := ca.Source(pki.Identity{Component: pki.ComponentManager, Node: "bench"})
	if err != nil {
		return err
	}
	for i := range e.cfg.replicas {
		node := "node-" + strconv.Itoa(i+1)
		if err := ca.WriteDir(opts.TLSDir(node), pki.Identity{Component: pki.ComponentInstanceManager, Node: node}); err != nil {
			return err
		}
		im, err := localcluster.StartInstanceManager(opts, node, nil)
		if err != nil {
			return err
		}
		e.ims = append(e.ims, im)
		c, err := engineapi.NewClient(im.GRPCAddr, 0, pki.ClientConfig(manager, pki.ComponentInstanceManager))
		if err != nil {
			return err
		}
		e.clients = append(e.clients, c)
	}
	for i, c := range e.clients {
		if err := waitReady(ctx, c, e.ims[i]); err != nil {
			return err
		}
	}
	e.log.WithField("count", len(e.ims)).Info("Instance managers started")
	return nil
}

func waitReady(ctx context.Context, c *engineapi.Client, im *localcluster.InstanceManager) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.InstanceList(ctx)
		if err == nil {
			return nil
		}
		if im.Exited() || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("instance manager %s not ready: %w; its log:\n%s", im.GRPCAddr, err, im.LogTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// close stops everything start started, whatever state it got to, and
// removes the work directory unless asked to keep it.
func (e *env) close(failed bool) error {
	var errs []error
	for _, c := range e.clients {
		errs = append(errs, c.Close())
	}
	for _, im := range e.ims {
		if failed {
			e.log.WithField("log", im.LogPath).Warnf("Last lines of the instance manager's log:\n%s", im.LogTail(20))
		}
		errs = append(errs, im.Stop(10*time.Second))
	}
	if e.s3 != nil {
		if failed {
			log := filepath.Join(e.s3.Dir, "versitygw.log")
			e.log.WithField("log", log).Warnf("Last lines of the S3 server's log:\n%s", localcluster.TailFile(log, 10))
		}
		errs = append(errs, e.s3.Stop())
	}
	if e.cfg.keep {
		e.log.WithField("dir", e.work).Info("Work directory kept")
	} else {
		errs = append(errs, removeAll(e.work))
	}
	return errors.Join(errs...)
}

func (e *env) target() engineapi.BackupTarget { return e.targetAt(targetPrefix) }

func (e *env) targetAt(prefix string) engineapi.BackupTarget {
	return engineapi.BackupTarget{URL: fmt.Sprintf("s3://%s@%s/%s", bucket, region, prefix),
		S3Endpoint: e.s3.Endpoint, AccessKey: e.s3.AccessKey, SecretKey: e.s3.SecretKey}
}

// diskDir holds the replicas of every node (one machine): each instance
// manager's extra --disk-path.
func (e *env) diskDir() string { return filepath.Join(e.work, "disk") }

func (e *env) createVolume(ctx context.Context, name string, size int64, frontend string) (*impb.Instance, error) {
	return benchvol.Create(ctx, e.clients, name, size, e.diskDir(), frontend)
}

// deleteVolume deletes what createVolume made, and the replicas' data:
// restored volumes would otherwise hold a GiB of disk each.
func (e *env) deleteVolume(ctx context.Context, name string) error {
	if _, err := e.clients[0].InstanceDelete(ctx, benchvol.EngineName(name)); err != nil {
		return err
	}
	for i, c := range e.clients {
		r := name + "-r" + strconv.Itoa(i+1)
		if _, err := c.InstanceDelete(ctx, r); err != nil {
			return err
		}
		if err := removeAll(filepath.Join(e.work, "disk", r)); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) snapshot(ctx context.Context, engine, name string) error {
	_, err := e.clients[0].SnapshotCreate(ctx, engine, name, true, nil, 0)
	return err
}

// phase is one timed step's figures.
type phase struct {
	bytes    int64 // data moved, for MiB/s
	d        time.Duration
	objects  int64 // objects it left in the bucket; -1: not counted
	requests map[string]int64
	status   *impb.BackupStatus // backups only
	cpu      cpuUse             // CPU time the processes spent in it
}

// backup runs one backup job through the instance manager and times it
// from the call to the status that says it completed.
func (e *env) backup(ctx context.Context, engine, snap, name, base, baseSnap string) (phase, error) {
	return e.backupTo(ctx, e.target(), engine, snap, name, base, baseSnap)
}

// fullBackup times -runs full backups of snap, all but the last to
// targets of their own (a second one to the same target would dedupe every
// chunk), and keeps the last one's objects and requests with the best
// time: the raw PUT it is compared with is the best of -runs too.
func (e *env) fullBackup(ctx context.Context, engine, snap, name string) (phase, error) {
	var best time.Duration
	var bestCPU cpuUse
	for i := 1; i < e.cfg.runs; i++ {
		p, err := e.backupTo(ctx, e.targetAt(fmt.Sprintf("tries/%d", i)), engine, snap, fmt.Sprintf("%s-try%d", name, i), "", "")
		if err != nil {
			return phase{}, err
		}
		if best == 0 || p.d < best {
			best, bestCPU = p.d, p.cpu
		}
	}
	p, err := e.backup(ctx, engine, snap, name, "", "")
	if err == nil && best != 0 && best < p.d {
		p.d, p.cpu = best, bestCPU
	}
	return p, err
}

func (e *env) backupTo(ctx context.Context, target engineapi.BackupTarget, engine, snap, name, base, baseSnap string) (phase, error) {
	before, err := e.objects(ctx)
	if err != nil {
		return phase{}, err
	}
	var st *impb.BackupStatus
	p, err := e.timedRequests(ctx, func() error {
		err := e.clients[0].SnapshotBackup(ctx, engineapi.SnapshotBackupArgs{Engine: engine, Snapshot: snap, Backup: name,
			Volume: "src", Target: target, BaseBackup: base, BaseSnapshot: baseSnap, Concurrency: int32(e.cfg.concurrency)})
		if err != nil {
			return err
		}
		st, err = pollJob(ctx, e.clients[0], engine, func(inst *impb.Instance) (string, string, *impb.BackupStatus) {
			s := inst.GetBackupStatus()[name]
			return s.GetState(), s.GetError(), s
		})
		return err
	})
	if err != nil {
		return phase{}, fmt.Errorf("backup %s of %s: %w", name, snap, err)
	}
	if base != "" && st.BaseBackup != base {
		return phase{}, fmt.Errorf("backup %s was not incremental on %s: %s", name, base, st.Message)
	}
	after, err := e.objects(ctx)
	if err != nil {
		return phase{}, err
	}
	p.bytes, p.objects, p.status = st.ReadChunks*st.ChunkSize, after-before, st
	e.log.WithFields(logrus.Fields{"backup": name, "seconds": p.d.Seconds(), "read": st.ReadChunks, "new": st.NewChunks,
		"newBytes": st.NewBytes, "objects": p.objects, "requests": total(p.requests)}).Info("Backup completed")
	return p, nil
}

// restoreAndCheck restores backup into a new volume (frontend off, as the
// instance manager requires), times it to the status that says it
// completed, then serves the volume over NBD and checks its SHA-256.
func (e *env) restoreAndCheck(ctx context.Context, backup, volume, newVol string, size, dataBytes int64, want string) (phase, error) {
	inst, err := e.createVolume(ctx, newVol, size, "")
	if err != nil {
		return phase{}, err
	}
	p, err := e.timedRequests(ctx, func() error {
		err := e.clients[0].BackupRestore(ctx, engineapi.BackupRestoreArgs{Engine: inst.Name, Backup: backup, Volume: volume,
			Target: e.target(), Concurrency: int32(e.cfg.concurrency)})
		if err != nil {
			return err
		}
		_, err = pollJob(ctx, e.clients[0], inst.Name, func(inst *impb.Instance) (string, string, *impb.RestoreStatus) {
			s := inst.GetRestoreStatus()
			if s.GetBackup() != backup {
				return "", "", nil
			}
			return s.GetState(), s.GetError(), s
		})
		return err
	})
	if err != nil {
		return phase{}, fmt.Errorf("restore of %s into %s: %w", backup, newVol, err)
	}
	p.bytes, p.objects = dataBytes, -1
	e.log.WithFields(logrus.Fields{"backup": backup, "volume": newVol, "seconds": p.d.Seconds(),
		"requests": total(p.requests)}).Info("Restore completed; checking its data")
	served, err := e.clients[0].FrontendStart(ctx, inst.Name, "nbd")
	if err != nil {
		return phase{}, err
	}
	got, err := e.volumeSHA256(ctx, served.FrontendEndpoint)
	if err != nil {
		return phase{}, err
	}
	if got != want {
		return phase{}, fmt.Errorf("volume %s restored from %s has SHA-256 %s, the source had %s at the backup's snapshot",
			newVol, backup, got, want)
	}
	return p, e.deleteVolume(ctx, newVol)
}

// pollJob reads the engine until state says the job ended: its status when
// it completed, its error otherwise.
func pollJob[S any](ctx context.Context, c *engineapi.Client, engine string, state func(*impb.Instance) (string, string, S)) (S, error) {
	var none S
	for {
		inst, err := c.InstanceGet(ctx, engine)
		if err != nil {
			return none, err
		}
		switch st, msg, s := state(inst); st {
		case engineapi.JobStateCompleted:
			return s, nil
		case engineapi.JobStateError:
			return none, errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return none, ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

// timedRequests syncs dirty data first (untimed, so earlier steps'
// writeback does not weigh on this one), then times fn and counts the
// requests the server logged meanwhile.
func (e *env) timedRequests(ctx context.Context, fn func() error) (phase, error) {
	syscall.Sync()
	from, err := e.requestLogMark()
	if err != nil {
		return phase{}, err
	}
	p, err := e.timed(fn)
	if err != nil {
		return phase{}, err
	}
	p.requests, err = e.requestsSince(ctx, from)
	return p, err
}
