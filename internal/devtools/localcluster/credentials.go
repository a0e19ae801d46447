package localcluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// ServiceAccountTokenTTL is how long ServiceAccountKubeconfig tokens live:
	// long enough that a `make run` session left open overnight keeps working.
	ServiceAccountTokenTTL = 48 * time.Hour
	// maxTokenTTL is what the API server allows; it must exceed the TTL asked for.
	maxTokenTTL = 7 * 24 * time.Hour
)

// writeServiceAccountKey writes a fresh RSA key that the API server uses both
// to sign service account tokens and (its public half) to verify them.
func writeServiceAccountKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der := x509.MarshalPKCS1PrivateKey(key)
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: der}), 0o600)
}

// writeAdminToken writes a static token file granting system:masters and
// returns the token.
func writeAdminToken(path string) (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	// Format: token,user,uid,"group1,group2".
	line := fmt.Sprintf("%s,strata-admin,strata-admin,\"system:masters\"\n", token)
	return token, os.WriteFile(path, []byte(line), 0o600)
}

// writeKubeconfig writes a single-context kubeconfig using a bearer token.
func writeKubeconfig(path, server string, caData []byte, user, token, namespace string) error {
	return writeKubeconfigFor(path, server, caData, user, &clientcmdapi.AuthInfo{Token: token}, namespace)
}

// ClientCertificateKubeconfig writes a kubeconfig at path whose user is a
// client certificate of the cluster's CA for user in groups (as kubeadm's
// admin.conf is): no token anywhere in it.
func (c *Cluster) ClientCertificateKubeconfig(path, user string, groups ...string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	base := filepath.Join(filepath.Dir(path), user+"-client")
	certPEM, keyPEM, err := c.ca.issue(base, certRequest{CommonName: user, Groups: groups})
	if err != nil {
		return err
	}
	return writeKubeconfigFor(path, c.APIServerURL, c.CAData, user,
		&clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}, c.namespace)
}

func writeKubeconfigFor(path, server string, caData []byte, user string, auth *clientcmdapi.AuthInfo, namespace string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["strata-local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caData}
	cfg.AuthInfos[user] = auth
	cfg.Contexts["strata-local"] = &clientcmdapi.Context{Cluster: "strata-local", AuthInfo: user, Namespace: namespace}
	cfg.CurrentContext = "strata-local"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// ServiceAccountKubeconfig requests a token for namespace/name (which must
// exist) and writes a kubeconfig at path that authenticates as that
// ServiceAccount, with namespace as its default namespace. Tests use it to
// exercise the RBAC that ships in package/manifests.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name, path string) error {
	return c.serviceAccountKubeconfig(ctx, namespace, name, path, nil)
}

// serviceAccountKubeconfig is ServiceAccountKubeconfig with the token bound
// to an object when bound is set.
func (c *Cluster) serviceAccountKubeconfig(ctx context.Context, namespace, name, path string,
	bound *authenticationv1.BoundObjectReference) error {
	cs, err := kubernetes.NewForConfig(c.AdminConfig)
	if err != nil {
		return err
	}
	ttl := int64(ServiceAccountTokenTTL.Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl, BoundObjectRef: bound}},
		metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for service account %s/%s: %w", namespace, name, err)
	}
	user := fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name)
	if err := writeKubeconfig(path, c.APIServerURL, c.CAData, user, tr.Status.Token, namespace); err != nil {
		return err
	}
	log := c.log.WithFields(logrus.Fields{"serviceAccount": namespace + "/" + name, "kubeconfig": path,
		"expires": tr.Status.ExpirationTimestamp.Time})
	if bound != nil {
		log = log.WithField("boundTo", bound.Kind+" "+bound.Name)
	}
	log.Info("wrote service account kubeconfig")
	return nil
}

// restConfig is the admin client configuration. QPS is raised because the
// local API server is ours alone and client-side throttling only slows tests.
func restConfig(server string, caData []byte, token string) *rest.Config {
	return &rest.Config{
		Host:            server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: caData},
		QPS:             200,
		Burst:           400,
		UserAgent:       "strata-localcluster",
	}
}
