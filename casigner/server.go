// Package casigner is Strata's CA signer (strata-manager ca-signer): the
// one component that holds the CA key. The managers share a
// ServiceAccount, and RBAC cannot give one manager Pod a right its
// siblings lack, so no manager may read the key: each asks for its node's
// identities with CertificateSigningRequests, which this signer judges
// (internal/pki SigningPolicy: only the node the requester's token is
// bound to) and signs. While it leads, it also rotates the CA, publishes
// the trust (ConfigMap strata-ca-bundle) everyone else reads, and keeps
// the SnapshotMetadata sidecar's certificate.
package casigner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/strata-storage/strata/internal/leader"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

// Options configure the signer.
type Options struct {
	// Namespace holds the CA Secret, the trust ConfigMap and the Lease.
	Namespace string
	// Identity names this replica in the Lease (its Pod's name).
	Identity string
	// LeaseDuration is the Lease's; a dead leader is replaced about this
	// long after its last renewal.
	LeaseDuration time.Duration
	// CARotateBefore is how long before its expiry the CA is replaced.
	CARotateBefore time.Duration
	// SnapshotMetadata, when set, has the leader keep the SnapshotMetadata
	// sidecar's certificate and SnapshotMetadataService (snapshot_metadata.go).
	SnapshotMetadata *SnapshotMetadataOptions
	// Clock is the wall clock; tests replace it.
	Clock clock.Clock
}

func (o Options) validate() error {
	switch {
	case o.Namespace == "" || o.Identity == "":
		return errors.New("ca-signer: --namespace and --identity are required")
	case o.CARotateBefore <= 0 || o.CARotateBefore > pki.CAValidity/2:
		return fmt.Errorf("--ca-rotate-before: %s is not between 0 and %s, half the CA's validity",
			o.CARotateBefore, pki.CAValidity/2)
	case o.LeaseDuration < time.Second:
		return fmt.Errorf("--lease-duration: %s is shorter than 1s", o.LeaseDuration)
	case o.SnapshotMetadata != nil:
		return o.SnapshotMetadata.validate()
	}
	return nil
}

const (
	// resync is how often the leader looks at the CA when nothing tells
	// it to sooner.
	resync = time.Minute
	// reapplyEvery re-applies the unchanged trust ConfigMap and CR,
	// undoing an edit.
	reapplyEvery = 5 * time.Minute
	retryWait    = 2 * time.Second
	// promoteAfter is how long a new CA must have been in the webhook
	// configurations' bundle before it signs, so that the API server has
	// loaded it; the managers and instance managers trust it from the
	// trust ConfigMap within seconds.
	promoteAfter = 30 * time.Second
	// retireAfter is how long the replaced CA stays trusted after the new
	// one was promoted: every node's keeper asks for new identities on the
	// ConfigMap's change (seconds); after it a certificate of the old CA
	// is refused everywhere, which is what rotating after a key theft is
	// for.
	retireAfter = time.Minute
	// fieldManager names the signer's server-side applies.
	fieldManager = "strata-ca-signer"
)

// Server is the CA signer.
type Server struct {
	opts          Options
	log           logrus.FieldLogger
	kube          kubernetes.Interface
	secretsClient corev1client.SecretInterface
	factory       informers.SharedInformerFactory
	informer      cache.SharedIndexInformer
	secrets       corelisters.SecretNamespaceLister
	events        chan struct{} // the CA Secret changed
	csr           *pki.Signer
}

// New checks opts and watches the CA Secret.
func New(log logrus.FieldLogger, kube kubernetes.Interface, opts Options) (*Server, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: log.WithField("component", "ca-signer"), kube: kube,
		secretsClient: kube.CoreV1().Secrets(opts.Namespace), events: make(chan struct{}, 1)}
	s.factory, s.informer, s.secrets = pki.NewCASecretInformer(kube, opts.Namespace)
	notify := func(any) { leader.Poke(s.events) }
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, n any) { notify(n) }, DeleteFunc: notify}); err != nil {
		return nil, err
	}
	s.csr = &pki.Signer{Kube: kube, CA: s.signingCA, Now: opts.Clock.Now, Policy: s.policy()}
	return s, nil
}

// policy: the managers' ServiceAccount asks, for the node its token is
// bound to; a manager's certificates may name the chart's Services in
// front of every manager.
func (s *Server) policy() pki.SigningPolicy {
	names := append(pki.ServiceDNSNames(types.APIServiceName, s.opts.Namespace),
		pki.ServiceDNSNames(types.WebhookServiceName, s.opts.Namespace)...)
	return pki.SigningPolicy{
		Requester:       "system:serviceaccount:" + s.opts.Namespace + ":" + types.ManagerServiceAccount,
		NodeAddresses:   s.nodeAddresses,
		ManagerDNSNames: names,
	}
}

// nodeAddresses are the addresses a Node reports.
func (s *Server) nodeAddresses(name string) ([]net.IP, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	node, err := s.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	for _, a := range node.Status.Addresses {
		if ip := net.ParseIP(a.Address); ip != nil {
			ips = append(ips, ip)
		}
	}
	return ips, nil
}

// signingCA is the CA that signs now, from the cached Secret.
func (s *Server) signingCA() (*pki.KeyPair, error) {
	secret, err := s.secrets.Get(pki.CASecretName)
	if err != nil {
		return nil, fmt.Errorf("Secret %s: %w", pki.CASecretName, err)
	}
	state, err := pki.ParseCAState(secret.Data)
	if err != nil {
		return nil, fmt.Errorf("Secret %s: %w", pki.CASecretName, err)
	}
	return state.Current, nil
}

// Run campaigns for the Lease until ctx ends and, while leading, keeps the
// CA and signs requests.
func (s *Server) Run(ctx context.Context) error {
	s.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return ctx.Err()
	}
	leader.Election{Kube: s.kube, Namespace: s.opts.Namespace, Lease: types.SignerLeaseName,
		Identity: s.opts.Identity, LeaseDuration: s.opts.LeaseDuration, Log: s.log}.Campaign(ctx, s.lead)
	return nil
}

// lead keeps the CA and signs requests while this replica leads. Requests
// are signed once the CA exists (the first pass creates it).
func (s *Server) lead(ctx context.Context) {
	s.log.Info("Leading: keeping the CA and signing the managers' certificate requests")
	var st leaderState
	signing := false
	for {
		next, err := s.reconcile(ctx, &st)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.WithError(err).Warn("CA signer pass failed; retrying")
			next = retryWait
		} else if !signing {
			signing = true
			go s.csr.Run(ctx, s.log)
		}
		if !leader.Sleep(ctx, s.opts.Clock, next, s.events) {
			return
		}
	}
}

// caSecret is the CA Secret from the cache, or from the API server
// (created with a new CA if need be) while the cache does not hold it.
func (s *Server) caSecret(ctx context.Context) (*corev1.Secret, error) {
	secret, err := s.secrets.Get(pki.CASecretName)
	if err == nil {
		return secret, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	return pki.LoadOrCreateCASecret(ctx, s.secretsClient, s.opts.Clock.Now())
}
