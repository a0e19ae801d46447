// Package leader runs a component's leader election on a Lease: the webhook
// leader among the managers, the CA signer among its replicas.
package leader

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
)

// Timings derives the election's timings from the lease duration: a dead
// leader's Lease runs out after lease and a peer tries every fifth of it,
// so a new leader leads within about 1.2 lease durations. client-go
// requires renew < lease and retry × 1.2 < renew.
func Timings(leaseDuration time.Duration) (lease, renew, retry time.Duration) {
	return leaseDuration, leaseDuration * 2 / 3, leaseDuration / 5
}

// Election is one candidate's campaign for a Lease.
type Election struct {
	Kube      kubernetes.Interface
	Namespace string
	Lease     string
	// Identity names this candidate in the Lease.
	Identity      string
	LeaseDuration time.Duration
	Log           logrus.FieldLogger
}

// Campaign runs for the Lease until ctx ends, and calls lead while it holds
// it; lead's context ends when the Lease is lost. A candidate that stops
// releases the Lease, so that a peer takes over at once instead of a lease
// later.
func (e Election) Campaign(ctx context.Context, lead func(ctx context.Context)) {
	lease, renew, retry := Timings(e.LeaseDuration)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: e.Lease, Namespace: e.Namespace},
		Client:     e.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	log := e.Log.WithField("lease", e.Lease)
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: e.Lease,
			LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: lead,
				OnStoppedLeading: func() { log.Info("No longer the leader") },
				OnNewLeader:      func(identity string) { log.WithField("leader", identity).Info("Leader elected") },
			},
		})
		if err != nil {
			log.WithError(err).Error("Cannot run the leader election")
			return
		}
		le.Run(ctx) // returns when ctx ends or leadership is lost; campaign again
	}
}

// Sleep is a leader loop's wait between passes: d, an event (something the
// loop watches changed), or the end of ctx (false).
func Sleep(ctx context.Context, clk clock.Clock, d time.Duration, events <-chan struct{}) bool {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-events:
	case <-t.C():
	}
	return true
}

// Poke wakes a loop without blocking: one pending event is enough.
func Poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
