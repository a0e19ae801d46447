package pki

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// NewCASecretInformer watches the CA Secret alone, so that a component's
// RBAC can name it instead of granting every Secret of the namespace.
func NewCASecretInformer(kube kubernetes.Interface, namespace string) (informers.SharedInformerFactory,
	cache.SharedIndexInformer, corelisters.SecretNamespaceLister) {
	factory := informers.NewSharedInformerFactoryWithOptions(kube, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", CASecretName).String()
		}))
	secrets := factory.Core().V1().Secrets()
	return factory, secrets.Informer(), secrets.Lister().Secrets(namespace)
}

// KeeperOptions configure a node's Keeper.
type KeeperOptions struct {
	Namespace, Node string
	// ManagerHosts are the addresses users' tools reach this manager's
	// HTTPS API at (IP SANs and DNS names of its certificate).
	ManagerHosts []string
	// InstanceManagerDir is where the node's instance manager reads its
	// certificate and the bundle (its --tls-dir); empty: no instance
	// manager on this node.
	InstanceManagerDir string
	// InstanceManagerHosts are the addresses its gRPC and data listeners
	// are dialled at (IP SANs and DNS names): peers check them
	// (ForAddress), so that another node's certificate is refused.
	InstanceManagerHosts []string
	Clock                clock.Clock
}

// Keeper keeps a node's identities current: the manager's own (in memory)
// and its instance manager's (written to InstanceManagerDir), re-issued
// when the CA Secret changes or they are two thirds through their life,
// and the bundle rewritten when the Secret's changes (a rotation's first
// phase), so that the instance manager trusts a new CA before anyone
// presents a certificate it signed.
type Keeper struct {
	opts     KeeperOptions
	log      logrus.FieldLogger
	kube     kubernetes.Interface
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	secrets  corelisters.SecretNamespaceLister
	events   chan struct{}
	ready    chan struct{}

	// Manager is this manager's identity, for its clients and servers.
	Manager MemorySource
	// imCert and imBundle are what InstanceManagerDir holds.
	imCert   *IssuedCert
	imBundle []byte
}

// NewKeeper watches the CA Secret; Run keeps the identities.
func NewKeeper(log logrus.FieldLogger, kube kubernetes.Interface, opts KeeperOptions) (*Keeper, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	k := &Keeper{opts: opts, log: log.WithField("component", "certificates"), kube: kube,
		events: make(chan struct{}, 1), ready: make(chan struct{})}
	k.factory, k.informer, k.secrets = NewCASecretInformer(kube, opts.Namespace)
	notify := func(any) {
		select {
		case k.events <- struct{}{}:
		default:
		}
	}
	if _, err := k.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, n any) { notify(n) }, DeleteFunc: notify}); err != nil {
		return nil, err
	}
	if opts.InstanceManagerDir != "" {
		// After a restart: keep what the instance manager already has
		// while it is still good and names its address (one issued before
		// certificates named it, or for another address, is replaced).
		if cert, bundle, err := ReadDir(opts.InstanceManagerDir); err == nil && IssuedFor(cert.Leaf, opts.InstanceManagerHosts) {
			k.imCert = &IssuedCert{TLS: cert, RenewAt: cert.Leaf.NotBefore.Add(cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore) * 2 / 3)}
			for _, c := range bundle {
				if cert.Leaf.CheckSignatureFrom(c) == nil {
					k.imCert.Issuer = c
				}
			}
			k.imBundle = bundlePEM(bundle)
		}
	}
	return k, nil
}

// Ready is closed once both identities have been issued.
func (k *Keeper) Ready() <-chan struct{} { return k.ready }

// Run keeps the identities current until ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	k.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), k.informer.HasSynced) {
		return
	}
	for {
		next, err := k.refresh(ctx)
		if err != nil {
			k.log.WithError(err).Warn("Cannot refresh this node's certificates; retrying")
			next = 2 * time.Second
		}
		t := k.opts.Clock.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-k.events:
		case <-t.C():
		}
		t.Stop()
	}
}

// refresh issues what is due and returns when to look again.
func (k *Keeper) refresh(ctx context.Context) (time.Duration, error) {
	secret, err := k.caSecret(ctx)
	if err != nil {
		return 0, err
	}
	state, err := ParseCAState(secret.Data)
	if err != nil {
		return 0, fmt.Errorf("Secret %s: %w", CASecretName, err)
	}
	now := k.opts.Clock.Now()
	if cur := k.Manager.Issued(); cur.Due(state, now) {
		c, err := IssueIdentity(state.Current, Identity{Component: ComponentManager, Node: k.opts.Node}, k.opts.ManagerHosts, now)
		if err != nil {
			return 0, err
		}
		k.Manager.Set(c, state.Bundle)
		k.log.WithFields(logrus.Fields{"identity": Identity{ComponentManager, k.opts.Node}.String(),
			"renewAt": c.RenewAt.Format(time.RFC3339)}).Info("Issued this manager's certificate")
	} else {
		k.Manager.Set(cur, state.Bundle) // the bundle may have changed
	}
	next := k.Manager.Issued().RenewAt.Sub(now)
	if k.opts.InstanceManagerDir != "" {
		imNext, err := k.refreshInstanceManager(state, now)
		if err != nil {
			return 0, err
		}
		next = min(next, imNext)
	}
	select {
	case <-k.ready:
	default:
		close(k.ready)
	}
	return max(next, time.Second), nil
}

func (k *Keeper) refreshInstanceManager(state *CAState, now time.Time) (time.Duration, error) {
	cert, bundle := k.imCert, state.BundlePEM()
	if cert.Due(state, now) {
		var err error
		if cert, err = IssueIdentity(state.Current, Identity{Component: ComponentInstanceManager, Node: k.opts.Node},
			k.opts.InstanceManagerHosts, now); err != nil {
			return 0, err
		}
	}
	if cert != k.imCert || !bytes.Equal(bundle, k.imBundle) {
		if err := WriteDir(k.opts.InstanceManagerDir, cert, state.Bundle); err != nil {
			return 0, fmt.Errorf("writing the instance manager's certificate: %w", err)
		}
		k.log.WithFields(logrus.Fields{"dir": k.opts.InstanceManagerDir, "renewed": cert != k.imCert,
			"cas": len(state.Bundle)}).Info("Wrote the instance manager's certificate and CA bundle")
		k.imCert, k.imBundle = cert, bundle
	}
	return cert.RenewAt.Sub(now), nil
}

// caSecret is the CA Secret from the cache, created if there is none yet
// (the first manager to start creates the CA).
func (k *Keeper) caSecret(ctx context.Context) (*corev1.Secret, error) {
	secret, err := k.secrets.Get(CASecretName)
	if err == nil {
		return secret, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	return LoadOrCreateCASecret(ctx, k.kube.CoreV1().Secrets(k.opts.Namespace), k.opts.Clock.Now())
}

// SourceFromSecret issues an identity from the CA Secret for a tool that
// acts as a component (benches and tests that call instance managers
// directly); it needs read access to the Secret, which only an admin has.
func SourceFromSecret(ctx context.Context, kube kubernetes.Interface, namespace string, id Identity) (*MemorySource, error) {
	secret, err := kube.CoreV1().Secrets(namespace).Get(ctx, CASecretName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the CA Secret %s/%s: %w", namespace, CASecretName, err)
	}
	return SourceFromState(secret.Data, id)
}

// SourceFromState issues an identity from a CA Secret's data.
func SourceFromState(data map[string][]byte, id Identity) (*MemorySource, error) {
	state, err := ParseCAState(data)
	if err != nil {
		return nil, err
	}
	c, err := IssueIdentity(state.Current, id, nil, time.Now())
	if err != nil {
		return nil, err
	}
	var m MemorySource
	m.Set(c, state.Bundle)
	return &m, nil
}
