package backup

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const (
	// defaultBackupPollInterval is how often a target is looked at when its
	// spec.pollInterval is unset.
	defaultBackupPollInterval = 5 * time.Minute
	// backupTargetCallTimeout bounds one look at a target.
	backupTargetCallTimeout = 2 * time.Minute

	ConditionTypeAvailable = "Available"
	// Reasons of the Available condition.
	BackupTargetReasonReachable   = "Reachable"
	BackupTargetReasonInvalid     = "InvalidTarget"
	BackupTargetReasonCredentials = "CredentialsMissing"
	// BackupTargetReasonForbidden: the managers' Role does not let them
	// read the credential Secret (Secrets are readable by name only).
	BackupTargetReasonForbidden   = "CredentialsForbidden"
	BackupTargetReasonUnreachable = "Unreachable"

	EventReasonBackupTargetUnavailable = "BackupTargetUnavailable"
)

// syncBackupTarget looks at the target's store once: can it be reached with
// its credentials, and which backups does it hold. It writes the status
// (and the mirrored CRs) only when something changed, besides lastSyncedAt,
// and looks again after the poll interval.
func (c *BackupTargetController) syncBackupTarget(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return err
	}
	btRO, err := c.DS.BackupTargets.GetRO(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if responsible, err := c.IsResponsibleFor(key, btRO.Status.OwnerID, ""); err != nil || !responsible {
		return err
	}
	bt := btRO.DeepCopy()
	bt.Status.OwnerID = c.ControllerID
	callCtx, cancel := context.WithTimeout(ctx, backupTargetCallTimeout)
	defer cancel()
	reason, lookErr := c.lookAtTarget(callCtx, bt)
	c.setAvailable(bt, reason, lookErr)
	if lookErr == nil {
		bt.Status.LastSyncedAt = metav1.NewTime(c.DS.Clock.Now().Truncate(time.Second))
	}
	if !reflect.DeepEqual(bt.Status, btRO.Status) {
		if _, err := c.DS.BackupTargets.UpdateStatus(ctx, bt); err != nil {
			return err
		}
	}
	c.Queue.AddAfter(key, pollInterval(bt))
	return nil
}

// lookAtTarget opens the store, mirrors its backups and prunes the
// BackupVolumes it no longer holds backups of; the reason says what kind
// of failure an error is.
func (c *BackupTargetController) lookAtTarget(ctx context.Context, bt *v1beta1.BackupTarget) (string, error) {
	secret, err := targetCredentials(ctx, c.DS, bt)
	if errors.Is(err, errCredentialsForbidden) {
		return BackupTargetReasonForbidden, err
	}
	if err != nil {
		return BackupTargetReasonCredentials, err
	}
	store, err := c.storeFor(bt.Spec.BackupTargetURL, secret)
	if err != nil {
		return BackupTargetReasonInvalid, err
	}
	if s3, ok := store.(interface{ Check(context.Context) error }); ok {
		if err := s3.Check(ctx); err != nil {
			return BackupTargetReasonUnreachable, err
		}
	}
	tgt, err := backupstore.Open(ctx, store, backupstore.Options{})
	if err != nil {
		return BackupTargetReasonUnreachable, err
	}
	backups, err := tgt.ListBackups(ctx)
	if err != nil {
		return BackupTargetReasonUnreachable, err
	}
	if err := c.mirrorBackups(ctx, bt, tgt, backups); err != nil {
		return BackupTargetReasonReachable, fmt.Errorf("recording the target's backups: %w", err)
	}
	c.pruneBackupVolumes(ctx, bt, tgt, backups)
	return BackupTargetReasonReachable, nil
}

// errCredentialsForbidden marks a credential Secret the managers may not read.
var errCredentialsForbidden = errors.New("forbidden")

// targetCredentials reads a target's credential Secret in Strata's
// namespace, live: a Secret is read only when a target is used, so no
// informer (and no cluster-wide read of Secrets) is needed. Both the
// BackupTarget and the Backup controller read it here. The managers' Role
// lets them get Secrets by name only (types.BackupCredentialsSecret); a
// Secret it does not name is Forbidden, said so with the fix.
func targetCredentials(ctx context.Context, ds *datastore.DataStore, bt *v1beta1.BackupTarget) (map[string][]byte, error) {
	if bt.Spec.CredentialSecret == "" {
		return nil, nil
	}
	s, err := ds.KubeClient.CoreV1().Secrets(ds.Namespace).Get(ctx, bt.Spec.CredentialSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("spec.credentialSecret: Secret %s/%s not found", ds.Namespace, bt.Spec.CredentialSecret)
	}
	if apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("spec.credentialSecret: reading Secret %s/%s is %w to the managers, who read Secrets by name "+
			"only: add %q to the resourceNames of the secrets get rule of Role %s in %s, or use Secret %s (%v)",
			ds.Namespace, bt.Spec.CredentialSecret, errCredentialsForbidden, bt.Spec.CredentialSecret, types.ManagerServiceAccount,
			ds.Namespace, types.BackupCredentialsSecret, err)
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", ds.Namespace, bt.Spec.CredentialSecret, err)
	}
	return s.Data, nil
}

// setAvailable sets status.available and the Available condition, with an
// event when the target turns unavailable.
func (c *BackupTargetController) setAvailable(bt *v1beta1.BackupTarget, reason string, err error) {
	cond := metav1.Condition{Type: ConditionTypeAvailable, Status: metav1.ConditionTrue, Reason: reason,
		Message: "the store answers and its backups are listed", ObservedGeneration: bt.Generation,
		// Whole seconds, as the API server stores it: a sub-second time would
		// differ from its own read-back and rewrite an unchanged status.
		LastTransitionTime: metav1.NewTime(c.DS.Clock.Now().Truncate(time.Second))}
	if err != nil {
		cond.Status, cond.Message = metav1.ConditionFalse, err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			cond.Message = fmt.Sprintf("no answer within %s: %v", backupTargetCallTimeout, err)
		}
	}
	was := meta.FindStatusCondition(bt.Status.Conditions, ConditionTypeAvailable)
	if err != nil && (was == nil || was.Status != metav1.ConditionFalse || was.Message != cond.Message) {
		c.Recorder.Event(bt, corev1.EventTypeWarning, EventReasonBackupTargetUnavailable, cond.Message)
		c.Logger.WithField("backupTarget", bt.Name).WithError(err).Warn("Backup target unavailable")
	}
	meta.SetStatusCondition(&bt.Status.Conditions, cond)
	bt.Status.Available = err == nil
}

func pollInterval(bt *v1beta1.BackupTarget) time.Duration {
	if d := bt.Spec.PollInterval.Duration; d > 0 {
		return d
	}
	return defaultBackupPollInterval
}
