package api

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	certutil "k8s.io/client-go/util/cert"
)

// Users whose kubeconfig holds a client certificate (kubeadm's admin.conf,
// a certificate from the CSR API) reach the API with it, as they reach the
// Kubernetes API server: the chain is verified against the client CA the
// API server publishes for extension servers, and the user is the
// certificate's common name with its organizations as groups (client-go's
// x509 authenticator does the verifying and the naming).

// The ConfigMap the API server writes its client CA into.
const (
	ClientCANamespace = metav1.NamespaceSystem
	ClientCAConfigMap = "extension-apiserver-authentication"
	clientCAKey       = "client-ca-file"
)

// ClusterClientCA follows the API server's client CA. It is written by
// hand rather than with k8s.io/apiserver's ConfigMapCAController, which
// queues a recheck every minute: Strata's managers keep a quiet minute.
type ClusterClientCA struct {
	informer cache.SharedIndexInformer
	opts     atomic.Pointer[x509.VerifyOptions]
	log      logrus.FieldLogger
}

// NewClusterClientCA watches namespace/name (the manager needs get, list
// and watch on it: the extension-apiserver-authentication-reader Role).
func NewClusterClientCA(client kubernetes.Interface, namespace, name string, log logrus.FieldLogger) *ClusterClientCA {
	c := &ClusterClientCA{log: log.WithField("configMap", namespace+"/"+name)}
	c.informer = coreinformers.NewFilteredConfigMapInformer(client, namespace, 0, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	load := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if ok {
			c.load(cm)
		}
	}
	_, _ = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    load,
		UpdateFunc: func(_, obj any) { load(obj) },
		DeleteFunc: func(any) {
			c.opts.Store(nil)
			c.log.Warn("The cluster's client CA is gone: client certificates are refused")
		},
	})
	return c
}

func (c *ClusterClientCA) load(cm *corev1.ConfigMap) {
	pemData := cm.Data[clientCAKey]
	if pemData == "" {
		c.opts.Store(nil)
		c.log.Warnf("The ConfigMap has no %s: client certificates are refused", clientCAKey)
		return
	}
	pool, err := certutil.NewPoolFromBytes([]byte(pemData))
	if err != nil {
		c.opts.Store(nil)
		c.log.WithError(err).Warn("The cluster's client CA does not parse: client certificates are refused")
		return
	}
	opts := x509request.DefaultVerifyOptions()
	opts.Roots = pool
	c.opts.Store(&opts)
	c.log.Info("Loaded the cluster's client CA")
}

// Run follows the ConfigMap until ctx ends.
func (c *ClusterClientCA) Run(ctx context.Context) { c.informer.RunWithContext(ctx) }

// VerifyOptions are the options a user's certificate is verified with;
// false while no CA is known.
func (c *ClusterClientCA) VerifyOptions() (x509.VerifyOptions, bool) {
	if o := c.opts.Load(); o != nil {
		return *o, true
	}
	return x509.VerifyOptions{}, false
}

// certificateUser names a verified certificate's user as the API server
// does, and adds system:authenticated as its authenticator chain does, so
// the access reviews see the groups RBAC binds.
var certificateUser = x509request.UserConversionFunc(func(chain []*x509.Certificate) (*authenticator.Response, bool, error) {
	resp, ok, err := x509request.CommonNameUserConversion.User(chain)
	if !ok || err != nil {
		return resp, ok, err
	}
	groups := resp.User.GetGroups()
	if !slices.Contains(groups, user.AllAuthenticated) {
		groups = append(slices.Clone(groups), user.AllAuthenticated)
	}
	resp.User = &user.DefaultInfo{Name: resp.User.GetName(), UID: resp.User.GetUID(), Groups: groups, Extra: resp.User.GetExtra()}
	return resp, true, nil
})

// WithClientCertificates makes a also authenticate users by a TLS client
// certificate verified with verify (a ClusterClientCA's VerifyOptions)
// when a request has no Authorization header.
func (a *KubeAuth) WithClientCertificates(verify x509request.VerifyOptionFunc) *KubeAuth {
	a.certs = x509request.NewDynamic(verify, certificateUser)
	return a
}

// authenticateCertificate is the user of r's client certificate; false
// when r has none or a does not take them.
func (a *KubeAuth) authenticateCertificate(r *http.Request) (user.Info, bool, error) {
	if a.certs == nil || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil, false, nil
	}
	resp, ok, err := a.certs.AuthenticateRequest(r)
	if err != nil {
		return nil, true, fmt.Errorf("the client certificate %q: %v: %w", r.TLS.PeerCertificates[0].Subject.CommonName, err, ErrUnauthenticated)
	}
	if !ok {
		return nil, true, fmt.Errorf("client certificates are not accepted now (the cluster's client CA is unknown to this manager): %w", ErrUnauthenticated)
	}
	return resp.User, true, nil
}
