package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/internal/leader"
)

// campaign runs for the leader Lease until ctx ends, and leads while it holds it.
func (s *Server) campaign(ctx context.Context) {
	leader.Election{Kube: s.kube, Namespace: s.opts.Namespace, Lease: LeaderLeaseName, Identity: s.opts.Identity,
		LeaseDuration: s.opts.LeaseDuration, Log: s.log}.Campaign(ctx, s.lead)
}

// leaderState is what the leader remembers between passes.
type leaderState struct {
	applied   []byte    // the configurations last applied
	appliedAt time.Time // when they were last applied
}

// lead keeps the configurations current while this manager leads.
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
		if !leader.Sleep(ctx, s.opts.Clock, next, s.leaderEvents) {
			return
		}
	}
}

// errNoTrust: the keeper has not read the signer's bundle yet.
var errNoTrust = errors.New("no CA bundle yet (the CA signer publishes it)")

// reconcileAsLeader is one pass of the leader: apply the configurations
// with the signer's CA bundle and this manager as their target. It
// returns when to look again.
func (s *Server) reconcileAsLeader(ctx context.Context, st *leaderState) (time.Duration, error) {
	now := s.opts.Clock.Now()
	trust := s.opts.Trust()
	if trust == nil {
		return 0, errNoTrust
	}
	bundle := trust.BundlePEM()
	mutating := desiredMutating(s.target, bundle, s.handler.Rules(true))
	validating := desiredValidating(s.target, bundle, s.handler.Rules(false))
	desired, err := json.Marshal([]any{mutating, validating})
	if err != nil {
		return 0, err
	}
	if bytes.Equal(desired, st.applied) && now.Sub(st.appliedAt) < reapplyEvery {
		return leaderResync, nil
	}
	if err := applyConfigurations(ctx, s.kube, mutating, validating); err != nil {
		return 0, err
	}
	if !bytes.Equal(desired, st.applied) {
		s.log.WithFields(logrus.Fields{"target": s.target.String(), "cas": len(trust.Bundle)}).
			Info("Applied the webhook configurations")
	}
	st.applied, st.appliedAt = desired, now
	return leaderResync, nil
}
