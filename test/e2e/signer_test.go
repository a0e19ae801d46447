package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

// The one signer against the real API server (issue 46; docs/security.md
// "one signer"): the CA signer process (strata-manager ca-signer) signs a
// manager's request, for its own key, for the node the manager's token is
// bound to, and denies it another node's identity — the API server itself
// records the token's node in the request, which the requester cannot
// forge.
func TestIdentitySignerBindsRequestsToTheTokensNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := env.adminKube
	// Kubelet nodes, which report addresses (the process managers' bare
	// Nodes report none).
	nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: localcluster.KubeletNodeSelector})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(nodes.Items), 2)
	nodeA, nodeB := nodes.Items[0], nodes.Items[1]
	require.NotEmpty(t, nodeA.Status.Addresses)

	// The managers' ServiceAccount, its token bound to node A as a manager
	// Pod's on node A would be (no process manager runs there).
	ttl := int64(10 * time.Minute / time.Second)
	tr, err := admin.CoreV1().ServiceAccounts(types.DefaultNamespace).CreateToken(ctx, types.ManagerServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: nodeA.Name, UID: nodeA.UID}}},
		metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := rest.AnonymousClientConfig(env.managerConfig)
	cfg.BearerToken, cfg.UserAgent = tr.Status.Token, "e2e.test/signer"
	asNodeA := kubernetes.NewForConfigOrDie(cfg)
	ours := func(c certificatesv1.CertificateSigningRequest) bool {
		return c.Spec.SignerName == pki.SignerName && slices.Equal(c.Spec.Extra[pki.NodeNameExtra], certificatesv1.ExtraValue{nodeA.Name})
	}
	t.Cleanup(func() {
		bg := context.Background()
		csrs, err := admin.CertificatesV1().CertificateSigningRequests().List(bg, metav1.ListOptions{})
		if err == nil {
			for _, c := range csrs.Items {
				if ours(c) {
					_ = admin.CertificatesV1().CertificateSigningRequests().Delete(bg, c.Name, metav1.DeleteOptions{})
				}
			}
		}
	})

	// What the signer publishes: the CAs to trust, and the one that signs.
	cm, err := admin.CoreV1().ConfigMaps(types.DefaultNamespace).Get(ctx, types.CABundleConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	bundle, err := pki.ParseCerts([]byte(cm.Data[types.CABundleKey]))
	require.NoError(t, err)
	signing, err := pki.ParseCerts([]byte(cm.Data[types.SigningCAKey]))
	require.NoError(t, err)
	require.Len(t, signing, 1)

	addressA := nodeA.Status.Addresses[0].Address
	own := pki.Identity{Component: pki.ComponentInstanceManager, Node: nodeA.Name}
	issued, err := pki.RequestIdentity(ctx, asNodeA, own, []string{addressA}, bundle, time.Now())
	require.NoError(t, err, "node A's identity for a token bound to node A")
	got, err := pki.IdentityOf(issued.TLS.Leaf)
	require.NoError(t, err)
	assert.Equal(t, own, got)
	assert.NoError(t, issued.TLS.Leaf.VerifyHostname(addressA))
	assert.True(t, issued.Issuer.Equal(signing[0]), "signed by the CA the signer says signs")

	other := pki.Identity{Component: pki.ComponentInstanceManager, Node: nodeB.Name}
	_, err = pki.RequestIdentity(ctx, asNodeA, other, nil, bundle, time.Now())
	require.Error(t, err, "node B's identity for a token bound to node A")
	assert.Contains(t, err.Error(), "denied")
	csrs, err := admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	var reasons []string
	for _, c := range csrs.Items {
		for _, cond := range c.Status.Conditions {
			if ours(c) && cond.Type == certificatesv1.CertificateDenied {
				reasons = append(reasons, cond.Message)
			}
		}
	}
	require.Len(t, reasons, 1)
	assert.Contains(t, reasons[0], "the requester's token is bound to node "+nodeA.Name)
}
