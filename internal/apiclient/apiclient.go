// Package apiclient is what a client of Strata's REST API needs besides
// HTTP: its credentials for the API (the kubeconfig's, trusting Strata's
// CA) and which manager to ask. kubectl strata and the CSI controller's
// SnapshotMetadata service use it.
package apiclient

import (
	"errors"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ErrNoCredentials: the kubeconfig's user has neither a token nor a client
// certificate (a user name and password only) for the Strata API.
var ErrNoCredentials = errors.New("the Strata API takes a bearer token or a client certificate, and this kubeconfig's user " +
	"has neither: pass --token, for example --token $(kubectl create token <serviceaccount>)")

// Config is restCfg's credentials (a token, a token file, an exec or auth
// provider, else a client certificate) for the Strata API, trusting
// Strata's CA; a token given here replaces the kubeconfig's.
func Config(restCfg *rest.Config, caBundle []byte, token string) (*rest.Config, error) {
	cfg := rest.CopyConfig(restCfg)
	userCert := rest.TLSClientConfig{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, CertData: cfg.CertData, KeyData: cfg.KeyData}
	cfg.TLSClientConfig = rest.TLSClientConfig{CAData: caBundle}
	if token != "" {
		cfg.BearerToken, cfg.BearerTokenFile, cfg.ExecProvider, cfg.AuthProvider = token, "", nil, nil
	}
	if cfg.BearerToken == "" && cfg.BearerTokenFile == "" && cfg.ExecProvider == nil && cfg.AuthProvider == nil {
		if len(userCert.CertData) == 0 && userCert.CertFile == "" {
			return nil, ErrNoCredentials
		}
		// The API verifies it against the cluster's client CA, as the API
		// server does (unless the chart's api.clientCertificates is off).
		cfg.CertFile, cfg.KeyFile, cfg.CertData, cfg.KeyData = userCert.CertFile, userCert.KeyFile, userCert.CertData, userCert.KeyData
	}
	cfg.Username, cfg.Password = "", ""
	return cfg, nil
}

// ReadyAddress is the API address (host:port) of the first ready Strata
// node by name that serves the API, or "".
func ReadyAddress(nodes []*v1beta1.Node) string {
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b *v1beta1.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, n := range sorted {
		if n.Status.APIAddress != "" && nodeReady(n) {
			return n.Status.APIAddress
		}
	}
	return ""
}

func nodeReady(n *v1beta1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1beta1.ConditionTypeReady {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}
