package backup

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The verify action (issue 15): a new spec.verifyRequestedAt on a Completed
// Backup has its owner read every block of the backup back from the target
// and check it against its SHA-256 (backupstore's Verify). That lasts as
// long as the data takes, so it runs beside the workers, as a clone's copy
// does (volume_clone_copy.go), and hands its outcome to the next sync. A
// manager restarted mid-verify forgets it; the status still says InProgress
// for that request, and the next sync starts it over.

const (
	EventReasonBackupVerified     = "BackupVerified"
	EventReasonBackupVerifyFailed = "BackupVerifyFailed"

	// backupVerifyTimeout bounds one verify: a TiB at 100 MiB/s takes 3 h.
	backupVerifyTimeout = 6 * time.Hour
	// backupVerifyConcurrency is the ranged GETs one verify runs at once.
	backupVerifyConcurrency = 4
)

// verifyRun is a verify this manager runs or ran for one request.
type verifyRun struct {
	requestedAt string
	cancel      context.CancelFunc
	done        bool
	chunks      int64
	bytes       int64
	err         error
}

// reconcileVerify answers spec.verifyRequestedAt on a finished backup:
// InProgress while it runs, then Passed or Failed for that request.
func (c *BackupController) reconcileVerify(b *v1beta1.Backup) {
	req := b.Spec.VerifyRequestedAt
	v := b.Status.Verification
	if req == "" || (v != nil && v.RequestedAt == req && v.State != v1beta1.BackupVerifyInProgress) {
		c.forgetVerify(b) // nothing asked, or answered (and written: this sync read it)
		return
	}
	if b.Status.State != v1beta1.BackupStateCompleted {
		c.setVerification(b, 0, fmt.Errorf("backup %s is in state %s: only a completed backup can be verified", b.Name, b.Status.State))
		return
	}
	run := c.verifyRunOf(b)
	switch {
	case run != nil && run.requestedAt == req && run.done:
		// Kept until a sync reads the answer back: a failed status write
		// must not start the verify over.
		c.setVerification(b, run.chunks, run.err)
		return
	case run != nil && run.requestedAt == req:
		// running
	default:
		bt, err := c.DS.BackupTargets.GetRO(DefaultBackupTargetName)
		switch {
		case err != nil:
			c.setVerification(b, 0, fmt.Errorf("no backup target %s: %w", DefaultBackupTargetName, err))
			return
		case b.Status.URL != "" && b.Status.URL != bt.Spec.BackupTargetURL:
			c.setVerification(b, 0, fmt.Errorf("backup %s is on %s, not on the default target %s", b.Name, b.Status.URL, bt.Spec.BackupTargetURL))
			return
		}
		c.startVerify(b, bt.DeepCopy())
	}
	b.Status.Verification = &v1beta1.BackupVerification{RequestedAt: req, State: v1beta1.BackupVerifyInProgress}
}

// startVerify runs the verify of b's current request in the background,
// cancelling one of an older request.
func (c *BackupController) startVerify(b *v1beta1.Backup, bt *v1beta1.BackupTarget) {
	req, volume, key := b.Spec.VerifyRequestedAt, backupVolumeName(b), b.Namespace+"/"+b.Name
	c.mu.Lock()
	if old := c.verifies[b.UID]; old != nil && old.cancel != nil {
		old.cancel()
	}
	ctx, cancel := context.WithTimeout(c.runCtx, backupVerifyTimeout)
	run := &verifyRun{requestedAt: req, cancel: cancel}
	c.verifies[b.UID] = run
	c.mu.Unlock()
	log := c.Logger.WithFields(logrus.Fields{"backup": b.Name, "volume": volume, "target": bt.Spec.BackupTargetURL,
		"requestedAt": req})
	log.Info("Backup verify started")
	go func() {
		defer cancel()
		rep, err := c.verifyBackup(ctx, bt, volume, b.Name)
		c.mu.Lock()
		run.done, run.err = true, err
		if rep != nil {
			run.chunks, run.bytes = rep.Chunks, rep.Bytes
		}
		c.mu.Unlock()
		log.WithFields(logrus.Fields{"chunks": run.chunks, "bytes": run.bytes}).WithError(err).Info("Backup verify ended")
		c.Queue.Add(key)
	}()
}

// verifyBackup reads the backup's manifest and every data chunk it lists.
func (c *BackupController) verifyBackup(ctx context.Context, bt *v1beta1.BackupTarget, volume, backup string) (*backupstore.VerifyReport, error) {
	if volume == "" {
		return nil, fmt.Errorf("backup %s names no volume", backup)
	}
	tgt, err := c.openTarget(ctx, bt)
	if err != nil {
		return nil, fmt.Errorf("opening backup target %s: %w", bt.Spec.BackupTargetURL, err)
	}
	m, err := tgt.LoadManifest(ctx, volume, backup)
	if err != nil {
		return nil, fmt.Errorf("backup %s of volume %s: reading its manifest: %w", backup, volume, err)
	}
	return tgt.Verify(ctx, m, backupVerifyConcurrency)
}

// setVerification records a finished verify of the current request.
func (c *BackupController) setVerification(b *v1beta1.Backup, chunks int64, err error) {
	v := &v1beta1.BackupVerification{RequestedAt: b.Spec.VerifyRequestedAt, State: v1beta1.BackupVerifyPassed,
		Chunks: chunks, VerifiedAt: metav1.NewTime(c.DS.Clock.Now().Truncate(time.Second))}
	if err != nil {
		v.State, v.Error = v1beta1.BackupVerifyFailed, err.Error()
		c.Recorder.Event(b, corev1.EventTypeWarning, EventReasonBackupVerifyFailed, v.Error)
	} else {
		c.Recorder.Eventf(b, corev1.EventTypeNormal, EventReasonBackupVerified,
			"all %d data chunks of backup %s read back from the target and matched their SHA-256", chunks, b.Name)
	}
	b.Status.Verification = v
}

func (c *BackupController) verifyRunOf(b *v1beta1.Backup) *verifyRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.verifies[b.UID]; r != nil {
		cp := *r
		return &cp
	}
	return nil
}

func (c *BackupController) forgetVerify(b *v1beta1.Backup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.verifies, b.UID)
}

// cancelVerify stops the verify of a backup being deleted.
func (c *BackupController) cancelVerify(b *v1beta1.Backup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.verifies[b.UID]; r != nil && r.cancel != nil {
		r.cancel()
	}
	delete(c.verifies, b.UID)
}

// Run keeps ctx for the verifies, then runs the workers.
func (c *BackupController) Run(ctx context.Context, workers int) {
	c.mu.Lock()
	c.runCtx = ctx
	c.mu.Unlock()
	c.BaseController.Run(ctx, workers)
}
