package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"time"

	"github.com/strata-storage/strata/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// ManagerMetricsClient reaches the managers' metrics port as a scraper
// does: HTTPS trusting the CA bundle Strata publishes in namespace, the
// admin's bearer token (the admin may get /metrics). It waits for the
// bundle, which the CA signer publishes once it leads.
func (c *Cluster) ManagerMetricsClient(ctx context.Context, namespace string) (*http.Client, error) {
	kube, err := kubernetes.NewForConfig(c.AdminConfig)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		cm, err := kube.CoreV1().ConfigMaps(namespace).Get(ctx, types.CABundleConfigMap, metav1.GetOptions{})
		return err == nil && pool.AppendCertsFromPEM([]byte(cm.Data[types.CABundleKey])), nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for Strata's CA bundle (ConfigMap %s/%s): %w", namespace, types.CABundleConfigMap, err)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &http.Client{Timeout: 10 * time.Second, Transport: bearer{token: c.AdminConfig.BearerToken, next: transport}}, nil
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
