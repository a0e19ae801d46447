// Package webhook runs Strata's admission webhooks in each manager: an HTTPS
// server for the rules in webhook/resources (framework in webhook/admission),
// its certificate signed by Strata's CA signer at its keeper's request, and
// — on the one manager elected leader — the
// Validating/MutatingWebhookConfigurations that point the API server here,
// with the CA bundle the signer publishes.
package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/leader"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/webhook/admission"
	"github.com/strata-storage/strata/webhook/resources/backingimage"
	"github.com/strata-storage/strata/webhook/resources/recurringjob"
	"github.com/strata-storage/strata/webhook/resources/resourcequota"
	"github.com/strata-storage/strata/webhook/resources/snapshot"
	"github.com/strata-storage/strata/webhook/resources/snapshotquota"
	"github.com/strata-storage/strata/webhook/resources/volume"
	"github.com/strata-storage/strata/webhook/resources/volumeattachment"
)

// Options configure one manager's webhook.
type Options struct {
	// Namespace holds the leader Lease and the Service.
	Namespace string
	// Identity names this manager in the leader election (its node name).
	Identity string
	// Listen is the HTTPS address, for example :9443 or 127.0.0.1:0.
	Listen string
	// Listener, when set, is Listen already bound (the daemon binds its
	// sockets first thing); the server takes it over.
	Listener net.Listener
	// URLHost, when set, makes the configurations point at
	// https://<URLHost>:<port> of the leader (local mode) instead of the
	// strata-webhook Service.
	URLHost string
	// Serving is the serving certificate (valid for ServingHosts), kept
	// current by the manager's keeper.
	Serving pki.Source
	// Trust is the CA bundle the signer published (nil before the
	// first); call TrustChanged when it changes.
	Trust func() *pki.Trust
	// LeaseDuration is the leader Lease's; a dead leader is replaced about
	// this long after its last renewal.
	LeaseDuration time.Duration
	// Clock is the wall clock; tests replace it.
	Clock clock.Clock
}

func (o Options) validate() error {
	switch {
	case o.Namespace == "" || o.Identity == "":
		return errors.New("webhook: namespace and identity are required")
	case o.Serving == nil || o.Trust == nil:
		return errors.New("webhook: no certificates (the keeper's serving certificate and trust)")
	case o.LeaseDuration < time.Second:
		return fmt.Errorf("webhook: lease duration %s is shorter than 1s", o.LeaseDuration)
	}
	return nil
}

const (
	// leaderResync is how often the leader looks at the configurations
	// when nothing tells it to sooner.
	leaderResync = time.Minute
	// reapplyEvery re-applies unchanged configurations, undoing an edit.
	reapplyEvery = 5 * time.Minute
	retryWait    = 2 * time.Second
)

// Server is one manager's webhook.
type Server struct {
	opts    Options
	log     logrus.FieldLogger
	kube    kubernetes.Interface
	handler *admission.Handler
	ln      net.Listener
	target  target
	// leaderEvents wakes the leader: the trust or the optional kinds changed.
	leaderEvents chan struct{}
}

// New checks opts, builds the handlers of every resource over the
// datastore's cache and binds the listen address.
func New(log logrus.FieldLogger, ds *datastore.DataStore, kube kubernetes.Interface, opts Options) (*Server, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	log = log.WithField("component", "webhook")
	handler, err := admission.NewHandler(log, opts.Namespace,
		[]admission.Mutator{volume.NewMutator(ds), volumeattachment.NewMutator(ds), snapshot.NewMutator(ds)},
		[]admission.Validator{volume.NewValidator(ds), volumeattachment.NewValidator(ds), snapshot.NewValidator(ds),
			snapshot.NewGroupValidator(ds), snapshotquota.NewVolumeGroupSnapshotValidator(ds),
			backingimage.NewValidator(ds), resourcequota.NewValidator(), recurringjob.NewValidator(),
			snapshotquota.NewVolumeSnapshotValidator(ds), snapshotquota.NewVMSnapshotValidator(ds),
			snapshotquota.NewVMBackupValidator(ds)})
	if err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(opts.Listen); err != nil {
		return nil, fmt.Errorf("--webhook-listen %q: %w", opts.Listen, err)
	}
	ln := opts.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", opts.Listen); err != nil {
			return nil, fmt.Errorf("--webhook-listen %s: %w", opts.Listen, err)
		}
	}
	s := &Server{opts: opts, log: log, kube: kube, handler: handler, ln: ln,
		target: serviceTarget(opts.Namespace), leaderEvents: make(chan struct{}, 1)}
	if opts.URLHost != "" {
		s.target = urlTarget(opts.URLHost, ln.Addr().(*net.TCPAddr).Port)
	}
	// A VM snapshot or backup kind installed or removed changes the rules.
	if ds.OptionalKinds != nil {
		ds.OptionalKinds.OnChange(func(datastore.OptionalKind) { leader.Poke(s.leaderEvents) })
	}
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// TrustChanged tells the leader that the published trust changed, so
// that it applies the new bundle at once.
func (s *Server) TrustChanged() { leader.Poke(s.leaderEvents) }

// Run serves until ctx ends: once the keeper has the serving certificate,
// it serves and campaigns for leadership.
func (s *Server) Run(ctx context.Context) error {
	if err := wait.PollUntilContextCancel(ctx, retryWait, true, func(context.Context) (bool, error) {
		_, err := s.opts.Serving.Certificate()
		return err == nil, nil
	}); err != nil {
		_ = s.ln.Close()
		return err
	}
	srv := &http.Server{
		Handler: s.handler.ServeMux(),
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.opts.Serving.Certificate() }},
		ReadHeaderTimeout: 10 * time.Second,
	}
	serveErr := make(chan error, 1)
	go func() {
		if err := srv.ServeTLS(s.ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
			serveErr <- err
		}
	}()
	s.log.WithFields(logrus.Fields{"address": s.ln.Addr().String(), "target": s.target.String()}).Info("Serving admission webhooks")

	loopCtx, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.campaign(loopCtx) })

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("webhook server: %w", err)
	}
	// Stop campaigning first: a leader releases the Lease so that a peer
	// takes over at once, then stops answering.
	stopLoops()
	wg.Wait()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	return err
}
