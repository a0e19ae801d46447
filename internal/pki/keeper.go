package pki

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/strata-storage/strata/types"
)

// NewCASecretInformer watches the CA Secret alone, so that the signer's
// RBAC can name it instead of granting every Secret of the namespace.
func NewCASecretInformer(kube kubernetes.Interface, namespace string) (informers.SharedInformerFactory,
	cache.SharedIndexInformer, corelisters.SecretNamespaceLister) {
	factory := oneObjectFactory(kube, namespace, CASecretName)
	secrets := factory.Core().V1().Secrets()
	return factory, secrets.Informer(), secrets.Lister().Secrets(namespace)
}

// NewTrustInformer watches the CA bundle ConfigMap alone.
func NewTrustInformer(kube kubernetes.Interface, namespace string) (informers.SharedInformerFactory,
	cache.SharedIndexInformer, corelisters.ConfigMapNamespaceLister) {
	factory := oneObjectFactory(kube, namespace, types.CABundleConfigMap)
	cms := factory.Core().V1().ConfigMaps()
	return factory, cms.Informer(), cms.Lister().ConfigMaps(namespace)
}

func oneObjectFactory(kube kubernetes.Interface, namespace, name string) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
}

// KeeperOptions configure a node's Keeper.
type KeeperOptions struct {
	Namespace, Node string
	// ManagerHosts are the addresses users' tools reach this manager's
	// HTTPS API at (IP SANs and DNS names of its certificate).
	ManagerHosts []string
	// WebhookHosts are the names of this manager's admission webhook
	// serving certificate (the Service's, loopback, the listen address);
	// empty: no webhook here.
	WebhookHosts []string
	// InstanceManagerDir is where the node's instance manager reads its
	// certificate and the bundle (its --tls-dir); empty: no instance
	// manager on this node.
	InstanceManagerDir string
	// InstanceManagerHosts are the addresses its gRPC and data listeners
	// are dialled at (IP SANs and DNS names): peers check them
	// (ForAddress), so that another node's certificate is refused.
	InstanceManagerHosts []string
	// RequestTimeout bounds the wait for the signer's answer to one
	// request; zero: a minute.
	RequestTimeout time.Duration
	Clock          clock.Clock
}

// Keeper keeps a node's identities current: the manager's own and its
// webhook's (in memory) and its instance manager's (written to
// InstanceManagerDir). It never holds the CA key: it makes each key here
// and asks the CA signer to sign it with a CertificateSigningRequest
// (RequestIdentity), when the published trust (the ConfigMap
// types.CABundleConfigMap) names a new signing CA or a certificate is two
// thirds through its life, and rewrites the instance manager's bundle when
// the published one changes (a rotation's first phase), so that it trusts
// a new CA before anyone presents a certificate it signed.
type Keeper struct {
	opts     KeeperOptions
	log      logrus.FieldLogger
	kube     kubernetes.Interface
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	trusts   corelisters.ConfigMapNamespaceLister
	events   chan struct{}
	ready    chan struct{}

	// Manager is this manager's identity, for its clients and servers.
	Manager MemorySource
	// Webhook is the admission webhook's serving certificate.
	Webhook MemorySource
	// imCert and imBundle are what InstanceManagerDir holds.
	imCert   *IssuedCert
	imBundle []byte

	mu        sync.Mutex
	trust     *Trust
	listeners []func()
}

// NewKeeper watches the CA bundle ConfigMap; Run keeps the identities.
func NewKeeper(log logrus.FieldLogger, kube kubernetes.Interface, opts KeeperOptions) (*Keeper, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = time.Minute
	}
	k := &Keeper{opts: opts, log: log.WithField("component", "certificates"), kube: kube,
		events: make(chan struct{}, 1), ready: make(chan struct{})}
	k.factory, k.informer, k.trusts = NewTrustInformer(kube, opts.Namespace)
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

// Ready is closed once every identity has been issued.
func (k *Keeper) Ready() <-chan struct{} { return k.ready }

// Trust is the published trust last read; nil before the first.
func (k *Keeper) Trust() *Trust {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.trust
}

// OnTrustChange calls f each time the published trust changes (f must not
// block); a caller that registers late reads Trust first.
func (k *Keeper) OnTrustChange(f func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.listeners = append(k.listeners, f)
}

// Run keeps the identities current until ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	k.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), k.informer.HasSynced) {
		return
	}
	for {
		next, err := k.refresh(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
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

// ErrNoTrust: the CA signer has not published the trust yet.
var ErrNoTrust = errors.New("the CA signer (Deployment strata-ca-signer) has not published ConfigMap " +
	types.CABundleConfigMap + " yet")

// readTrust is the published trust from the cache.
func (k *Keeper) readTrust() (*Trust, error) {
	cm, err := k.trusts.Get(types.CABundleConfigMap)
	if apierrors.IsNotFound(err) {
		return nil, ErrNoTrust
	}
	if err != nil {
		return nil, err
	}
	trust, err := ParseTrust(cm.Data)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s: %w", types.CABundleConfigMap, err)
	}
	return trust, nil
}

// refresh asks for what is due and returns when to look again.
func (k *Keeper) refresh(ctx context.Context) (time.Duration, error) {
	trust, err := k.readTrust()
	if err != nil {
		return 0, err
	}
	k.setTrust(trust)
	now := k.opts.Clock.Now()
	next := time.Hour
	for _, m := range []struct {
		src   *MemorySource
		hosts []string
		what  string
	}{{&k.Manager, k.opts.ManagerHosts, "this manager's certificate"}, {&k.Webhook, k.opts.WebhookHosts, "the webhook serving certificate"}} {
		if m.src == &k.Webhook && len(m.hosts) == 0 {
			continue
		}
		cur := m.src.Issued()
		if cur.Due(trust.Signing, now) {
			if cur, err = k.request(ctx, ComponentManager, m.hosts, trust, m.what); err != nil {
				return 0, err
			}
		}
		m.src.Set(cur, trust.Bundle) // the bundle may have changed
		next = min(next, cur.RenewAt.Sub(now))
	}
	if k.opts.InstanceManagerDir != "" {
		imNext, err := k.refreshInstanceManager(ctx, trust, now)
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

// request asks the signer for this node's component identity.
func (k *Keeper) request(ctx context.Context, component string, hosts []string, trust *Trust, what string) (*IssuedCert, error) {
	id := Identity{Component: component, Node: k.opts.Node}
	ctx, cancel := context.WithTimeout(ctx, k.opts.RequestTimeout)
	defer cancel()
	c, err := RequestIdentity(ctx, k.kube, id, hosts, trust.Bundle, k.opts.Clock.Now())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	k.log.WithFields(logrus.Fields{"identity": id.String(), "hosts": hosts, "ca": c.Issuer.Subject.CommonName,
		"renewAt": c.RenewAt.Format(time.RFC3339)}).Info("The CA signer signed " + what)
	return c, nil
}

// setTrust records trust and tells the listeners when it changed.
func (k *Keeper) setTrust(trust *Trust) {
	k.mu.Lock()
	changed := k.trust == nil || !k.trust.Signing.Equal(trust.Signing) || !bytes.Equal(k.trust.BundlePEM(), trust.BundlePEM())
	k.trust = trust
	listeners := k.listeners
	k.mu.Unlock()
	if changed {
		for _, f := range listeners {
			f()
		}
	}
}

func (k *Keeper) refreshInstanceManager(ctx context.Context, trust *Trust, now time.Time) (time.Duration, error) {
	cert, bundle := k.imCert, trust.BundlePEM()
	if cert.Due(trust.Signing, now) {
		var err error
		if cert, err = k.request(ctx, ComponentInstanceManager, k.opts.InstanceManagerHosts, trust,
			"the instance manager's certificate"); err != nil {
			return 0, err
		}
	}
	if cert != k.imCert || !bytes.Equal(bundle, k.imBundle) {
		if err := WriteDir(k.opts.InstanceManagerDir, cert, trust.Bundle); err != nil {
			return 0, fmt.Errorf("writing the instance manager's certificate: %w", err)
		}
		k.log.WithFields(logrus.Fields{"dir": k.opts.InstanceManagerDir, "renewed": cert != k.imCert,
			"cas": len(trust.Bundle)}).Info("Wrote the instance manager's certificate and CA bundle")
		k.imCert, k.imBundle = cert, bundle
	}
	return cert.RenewAt.Sub(now), nil
}

// SourceFromSecret issues an identity from the CA Secret for a tool that
// acts as a component (benches and tests that call instance managers
// directly); it needs read access to the Secret, which only an admin and
// the signer have.
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
