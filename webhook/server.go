// Package webhook runs Strata's admission webhooks in each manager: an HTTPS
// server for the rules in webhook/resources (framework in webhook/admission),
// its certificates from a CA the managers share through a Secret, and — on
// the one manager elected leader — the CA's rotation and the
// Validating/MutatingWebhookConfigurations that point the API server here.
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
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/strata-storage/strata/datastore"
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
	// Namespace holds the CA Secret, the leader Lease and the Service.
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
	// CARotateBefore is how long before its expiry the CA is replaced.
	CARotateBefore time.Duration
	// LeaseDuration is the leader Lease's; a dead leader is replaced about
	// this long after its last renewal.
	LeaseDuration time.Duration
	// Clock is the wall clock; tests replace it.
	Clock clock.Clock
	// SnapshotMetadata, when set, has the leader keep the SnapshotMetadata
	// sidecar's certificate and SnapshotMetadataService (snapshot_metadata.go).
	SnapshotMetadata *SnapshotMetadataOptions
}

func (o Options) validate() error {
	switch {
	case o.Namespace == "" || o.Identity == "":
		return errors.New("webhook: namespace and identity are required")
	case o.CARotateBefore <= 0 || o.CARotateBefore > CAValidity/2:
		return fmt.Errorf("--webhook-ca-rotate-before: %s is not between 0 and %s, half the CA's validity",
			o.CARotateBefore, CAValidity/2)
	case o.LeaseDuration < time.Second:
		return fmt.Errorf("webhook: lease duration %s is shorter than 1s", o.LeaseDuration)
	case o.SnapshotMetadata != nil:
		return o.SnapshotMetadata.validate()
	}
	return nil
}

const (
	// leaderResync is how often the leader looks at the CA and the
	// configurations when nothing tells it to sooner.
	leaderResync = time.Minute
	// reapplyEvery re-applies unchanged configurations, undoing an edit.
	reapplyEvery = 5 * time.Minute
	// maxCertWait bounds how long the serving-certificate loop sleeps.
	maxCertWait = time.Hour
	retryWait   = 2 * time.Second
)

// Server is one manager's webhook.
type Server struct {
	opts    Options
	log     logrus.FieldLogger
	kube    kubernetes.Interface
	handler *admission.Handler
	certs   *ServingCerts
	ln      net.Listener
	target  target

	secretsClient  corev1client.SecretInterface
	secretInformer cache.SharedIndexInformer
	secrets        corelisters.SecretNamespaceLister
	factory        informers.SharedInformerFactory
	// Each loop is told when the CA Secret changes.
	certEvents, leaderEvents chan struct{}
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
	listenHost, _, err := net.SplitHostPort(opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("--webhook-listen %q: %w", opts.Listen, err)
	}
	ln := opts.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", opts.Listen); err != nil {
			return nil, fmt.Errorf("--webhook-listen %s: %w", opts.Listen, err)
		}
	}
	s := &Server{opts: opts, log: log, kube: kube, handler: handler, ln: ln,
		certs:         NewServingCerts(servingHosts(opts.Namespace, listenHost, opts.URLHost), opts.Clock),
		target:        serviceTarget(opts.Namespace),
		secretsClient: kube.CoreV1().Secrets(opts.Namespace),
		certEvents:    make(chan struct{}, 1), leaderEvents: make(chan struct{}, 1),
	}
	if opts.URLHost != "" {
		s.target = urlTarget(opts.URLHost, ln.Addr().(*net.TCPAddr).Port)
	}
	// The CA Secret alone, so the managers' RBAC can name it.
	s.factory, s.secretInformer, s.secrets = pki.NewCASecretInformer(kube, opts.Namespace)
	// A VM snapshot or backup kind installed or removed changes the rules.
	if ds.OptionalKinds != nil {
		ds.OptionalKinds.OnChange(func(datastore.OptionalKind) { poke(s.leaderEvents) })
	}
	notify := func(any) { poke(s.certEvents); poke(s.leaderEvents) }
	if _, err := s.secretInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, obj any) { notify(obj) }, DeleteFunc: notify,
	}); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Run serves until ctx ends. It first makes sure the CA Secret exists and
// issues this manager's certificate, then serves, keeps the certificate
// current and campaigns for leadership.
func (s *Server) Run(ctx context.Context) error {
	s.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.secretInformer.HasSynced) {
		_ = s.ln.Close()
		return ctx.Err()
	}
	if err := wait.PollUntilContextCancel(ctx, retryWait, true, func(ctx context.Context) (bool, error) {
		err := s.refreshServingCert(ctx)
		if err != nil {
			s.log.WithError(err).Warn("No webhook serving certificate yet; retrying")
		}
		return err == nil, nil
	}); err != nil {
		_ = s.ln.Close()
		return err
	}

	srv := &http.Server{
		Handler:           s.handler.ServeMux(),
		TLSConfig:         &tls.Config{GetCertificate: s.certs.GetCertificate, MinVersion: tls.VersionTLS12},
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
	wg.Go(func() { s.certLoop(loopCtx) })
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

// caSecret is the CA Secret from the cache, or from the API server (created
// if need be) while the cache does not hold it.
func (s *Server) caSecret(ctx context.Context) (*corev1.Secret, error) {
	secret, err := s.secrets.Get(CASecretName)
	if err == nil {
		return secret, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	return pki.LoadOrCreateCASecret(ctx, s.secretsClient, s.opts.Clock.Now())
}

func (s *Server) refreshServingCert(ctx context.Context) error {
	secret, err := s.caSecret(ctx)
	if err != nil {
		return err
	}
	state, err := pki.ParseCAState(secret.Data)
	if err != nil {
		return fmt.Errorf("Secret %s: %w", CASecretName, err)
	}
	reissued, err := s.certs.Refresh(state)
	if reissued {
		s.log.WithFields(logrus.Fields{"ca": state.Current.Cert.Subject.CommonName,
			"renewAt": s.certs.RenewAt().Format(time.RFC3339)}).Info("Issued the webhook serving certificate")
	}
	return err
}

// certLoop re-issues the serving certificate when the CA Secret changes and
// when the certificate is due.
func (s *Server) certLoop(ctx context.Context) {
	for {
		next := maxCertWait
		if err := s.refreshServingCert(ctx); err != nil {
			s.log.WithError(err).Warn("Cannot refresh the webhook serving certificate; retrying")
			next = retryWait
		} else if until := s.certs.RenewAt().Sub(s.opts.Clock.Now()); until < next {
			next = max(until, time.Second)
		}
		if !s.sleep(ctx, next, s.certEvents) {
			return
		}
	}
}

// sleep waits for d, an event, or the end of ctx (false).
func (s *Server) sleep(ctx context.Context, d time.Duration, events <-chan struct{}) bool {
	t := s.opts.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-events:
	case <-t.C():
	}
	return true
}

// poke wakes a loop without blocking: one pending event is enough.
func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
