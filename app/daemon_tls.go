package app

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v3"
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/api"
	"github.com/strata-storage/strata/internal/pki"

	"github.com/strata-storage/strata/types"
)

// tlsFlags are the daemon's certificate flags.
func tlsFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "instance-manager-tls-dir", Sources: cli.EnvVars("STRATA_INSTANCE_MANAGER_TLS_DIR"),
			Usage: "directory this manager writes its node's instance-manager certificate and the CA bundle into (the " +
				"instance manager's --tls-dir); required with --instance-manager-address"},
		&cli.StringFlag{Name: "api-client-ca-configmap", Value: api.ClientCANamespace + "/" + api.ClientCAConfigMap,
			Usage: "namespace/name of the ConfigMap whose client-ca-file verifies users' client certificates on the API " +
				"(the API server publishes it); their writes are made with the manager's rights after their access review, naming them. " +
				"Empty: users authenticate with bearer tokens only"},
	}
}

// startCertificates runs this node's certificate keeper in wg until ctx
// ends: the manager's identity (for its gRPC calls to instance managers and
// its HTTPS API), its webhook's serving certificate and the instance
// manager's identity, each signed by the CA signer at the keeper's request.
func startCertificates(ctx context.Context, wg *sync.WaitGroup, log logrus.FieldLogger, kube kubernetes.Interface,
	cfg daemonConfig) (*pki.Keeper, error) {
	if cfg.imAddress != "" && cfg.imTLSDir == "" {
		return nil, fmt.Errorf("--instance-manager-tls-dir is required with --instance-manager-address: " +
			"the instance manager accepts only callers with certificates")
	}
	keeper, err := pki.NewKeeper(log, kube, pki.KeeperOptions{Namespace: cfg.namespace, Node: cfg.nodeName,
		ManagerHosts: managerHosts(cfg), WebhookHosts: webhookHosts(cfg), InstanceManagerDir: cfg.imTLSDir, InstanceManagerHosts: instanceManagerHosts(cfg)})
	if err != nil {
		return nil, err
	}
	wg.Go(func() { keeper.Run(ctx) })
	return keeper, nil
}

// managerHosts are the names in this manager's certificate, for users'
// tools that check them against the API address they dial.
func managerHosts(cfg daemonConfig) []string {
	// Not loopback nor localhost: every manager's certificate would name
	// them, and a peer dialling the node whose address is loopback (the
	// local cluster's first node) would take any node's (pki.ForAddress).
	// The chart's Service in front of every manager's API.
	hosts := append([]string{cfg.nodeName}, pki.ServiceDNSNames(types.APIServiceName, cfg.namespace)...)
	for _, addr := range []string{cfg.apiListen, cfg.apiAdvertise} {
		if h, _, err := net.SplitHostPort(addr); err == nil && h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// instanceManagerHosts is the address this node's instance manager is
// dialled at (--instance-manager-address's host): the one name its
// certificate carries besides its identity, which peers check.
func instanceManagerHosts(cfg daemonConfig) []string {
	if h, _, err := net.SplitHostPort(cfg.imAddress); err == nil && h != "" {
		return []string{h}
	}
	return nil
}

// waitCertificates blocks until the CA signer has signed this node's
// identities, or ctx ends.
func waitCertificates(ctx context.Context, keeper *pki.Keeper) error {
	select {
	case <-keeper.Ready():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// requirePeer admits requests whose TLS client certificate chains to src's
// roots and names one of components.
func requirePeer(src pki.Source, components ...string) func(r *http.Request) error {
	return func(r *http.Request) error {
		if _, err := pki.VerifiedPeer(src, r.TLS, components...); err != nil {
			return fmt.Errorf("this route is for Strata's own components (%v): %w", components, err)
		}
		return nil
	}
}

// startUserClientCA follows the cluster's client CA named by
// --api-client-ca-configmap (namespace/name) in wg until ctx ends, and
// returns how users' certificates are verified; nil when the flag is empty.
func startUserClientCA(ctx context.Context, wg *sync.WaitGroup, kube kubernetes.Interface, ref string,
	log logrus.FieldLogger) (func() (x509.VerifyOptions, bool), error) {
	if ref == "" {
		return nil, nil
	}
	namespace, name, ok := strings.Cut(ref, "/")
	if !ok || namespace == "" || name == "" {
		return nil, fmt.Errorf("--api-client-ca-configmap %q: want namespace/name", ref)
	}
	ca := api.NewClusterClientCA(kube, namespace, name, log)
	wg.Go(func() { ca.Run(ctx) })
	return ca.VerifyOptions, nil
}
