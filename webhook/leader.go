package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/strata-storage/strata/internal/pki"
)

// leaderTimings derives the election's timings from the heartbeat lease
// duration: a dead leader's Lease runs out after leaseDuration and a peer
// tries every fifth of it, so a new leader serves within about 1.2 lease
// durations. client-go requires renew < lease and retry × 1.2 < renew.
func leaderTimings(leaseDuration time.Duration) (lease, renew, retry time.Duration) {
	return leaseDuration, leaseDuration * 2 / 3, leaseDuration / 5
}

// campaign runs for the leader Lease until ctx ends, and leads while it holds it.
func (s *Server) campaign(ctx context.Context) {
	lease, renew, retry := leaderTimings(s.opts.LeaseDuration)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaderLeaseName, Namespace: s.opts.Namespace},
		Client:     s.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: s.opts.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: "strata-webhook",
			LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
			// A manager that stops hands over at once instead of a lease later.
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: s.lead,
				OnStoppedLeading: func() { s.log.Info("No longer the webhook leader") },
				OnNewLeader: func(identity string) {
					s.log.WithField("leader", identity).Info("Webhook leader elected")
				},
			},
		})
		if err != nil {
			s.log.WithError(err).Error("Cannot run the webhook leader election")
			return
		}
		le.Run(ctx) // returns when ctx ends or leadership is lost; campaign again
	}
}

// leaderState is what the leader remembers between passes.
type leaderState struct {
	applied   []byte    // the configurations last applied
	appliedAt time.Time // when they were last applied
	changedAt time.Time // when what was applied last changed
	metadata  metadataState
}

// lead keeps the CA and the configurations current while this manager leads.
func (s *Server) lead(ctx context.Context) {
	s.log.WithField("target", s.target.String()).Info("Leading the webhook: writing the configurations")
	var st leaderState
	for {
		next, err := s.reconcileAsLeader(ctx, &st)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.WithError(err).Warn("Webhook leader pass failed; retrying")
			next = retryWait
		}
		if !s.sleep(ctx, next, s.leaderEvents) {
			return
		}
	}
}

// reconcileAsLeader is one pass of the leader: rotate the CA when due, apply
// the configurations with the CA bundle and this manager as their target,
// keep the snapshot metadata sidecar's certificate and CR current, and
// finish a rotation once the bundle is applied. It returns when to look
// again.
func (s *Server) reconcileAsLeader(ctx context.Context, st *leaderState) (time.Duration, error) {
	now := s.opts.Clock.Now()
	secret, err := s.caSecret(ctx)
	if err != nil {
		return 0, err
	}
	state, err := pki.ParseCAState(secret.Data)
	if err != nil {
		// Nothing can be served from a Secret that does not parse.
		s.log.WithError(err).Error("The webhook CA Secret is unusable; replacing it with a new CA")
		if state, err = pki.NewCAState(now); err != nil {
			return 0, err
		}
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	if _, asked := secret.Annotations[pki.AnnotationRotateCA]; asked {
		started, err := state.StartRotation(now)
		if err != nil {
			return 0, err
		}
		s.log.WithField("started", started).Info("Rotating the CA as the Secret's annotation asks")
		secret = secret.DeepCopy()
		delete(secret.Annotations, pki.AnnotationRotateCA)
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	if changed, err := state.Rotate(now, s.opts.CARotateBefore); err != nil {
		return 0, err
	} else if changed {
		s.log.WithFields(logrus.Fields{"current": state.Current.Cert.Subject.CommonName,
			"expires": state.Current.Cert.NotAfter.Format(time.RFC3339), "bundle": len(state.Bundle),
			"rotating": state.Next != nil}).Info("Rotating the webhook CA")
		// The Secret's update event brings the next pass.
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}

	bundle := state.BundlePEM()
	mutating := desiredMutating(s.target, bundle, s.handler.Rules(true))
	validating := desiredValidating(s.target, bundle, s.handler.Rules(false))
	desired, err := json.Marshal([]any{mutating, validating})
	if err != nil {
		return 0, err
	}
	if !bytes.Equal(desired, st.applied) || now.Sub(st.appliedAt) >= reapplyEvery {
		if err := applyConfigurations(ctx, s.kube, mutating, validating); err != nil {
			return 0, err
		}
		if err := applyCABundle(ctx, s.kube, s.opts.Namespace, bundle); err != nil {
			return 0, err
		}
		if !bytes.Equal(desired, st.applied) {
			s.log.WithFields(logrus.Fields{"target": s.target.String(), "cas": len(state.Bundle)}).
				Info("Applied the webhook configurations")
			st.changedAt = now
		}
		st.applied, st.appliedAt = desired, now
	}
	next, err := s.publishSnapshotMetadata(ctx, &st.metadata, state, now)
	if err != nil {
		return 0, err
	}

	// Phase 2 of a rotation: the bundle with the next CA has been in the
	// configurations long enough for the API server to trust it.
	if state.Next != nil {
		if wait := st.changedAt.Add(promoteAfter).Sub(now); wait > 0 {
			return min(wait, next), nil
		}
		state.Promote(now)
		s.log.WithField("ca", state.Current.Cert.Subject.CommonName).Info("The new webhook CA now signs serving certificates")
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	// Phase 3: the replaced CA leaves every trust bundle once everyone has
	// re-issued from the new one.
	if due := state.RetireDue(retireAfter); !due.IsZero() {
		if wait := due.Sub(now); wait > 0 {
			return min(wait, next), nil
		}
		if state.Retire() {
			s.log.WithFields(logrus.Fields{"ca": state.Current.Cert.Subject.CommonName, "cas": len(state.Bundle)}).
				Info("Retired the replaced CA: certificates it signed are refused from now on")
		}
		return retryWait, pki.WriteCAState(ctx, s.secretsClient, secret, state)
	}
	return min(leaderResync, next), nil
}
