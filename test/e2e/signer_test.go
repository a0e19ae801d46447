package e2e

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

// The one signer's design holds against the real API server (issue 46;
// docs/security.md "one signer", not wired into the product yet): a
// requester whose token is bound to node A gets node A's identity, signed,
// for its own key, and is denied node B's — the API server itself records
// the token's node in the request, which the requester cannot forge.
func TestIdentitySignerBindsRequestsToTheTokensNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := env.adminKube
	nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(nodes.Items), 2)
	nodeA, nodeB := nodes.Items[0], nodes.Items[1]

	// A requester of its own (the managers' role has no CSR rights yet).
	const sa = "e2e-identity-requester"
	requester := "system:serviceaccount:" + types.DefaultNamespace + ":" + sa
	_, err = admin.CoreV1().ServiceAccounts(types.DefaultNamespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: sa},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
			Verbs: []string{"create", "get", "list", "watch"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: sa},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: types.DefaultNamespace}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		bg := context.Background()
		_ = admin.RbacV1().ClusterRoleBindings().Delete(bg, sa, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(bg, sa, metav1.DeleteOptions{})
		_ = admin.CoreV1().ServiceAccounts(types.DefaultNamespace).Delete(bg, sa, metav1.DeleteOptions{})
		csrs, err := admin.CertificatesV1().CertificateSigningRequests().List(bg, metav1.ListOptions{})
		if err == nil {
			for _, c := range csrs.Items {
				if c.Spec.SignerName == pki.SignerName {
					_ = admin.CertificatesV1().CertificateSigningRequests().Delete(bg, c.Name, metav1.DeleteOptions{})
				}
			}
		}
	})
	// Its token bound to node A, as a Pod's on node A would be.
	ttl := int64(10 * time.Minute / time.Second)
	tr, err := admin.CoreV1().ServiceAccounts(types.DefaultNamespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl, BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Node", APIVersion: "v1", Name: nodeA.Name, UID: nodeA.UID}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := rest.AnonymousClientConfig(env.managerConfig)
	cfg.BearerToken, cfg.UserAgent = tr.Status.Token, "e2e.test/signer"
	asNodeA := kubernetes.NewForConfigOrDie(cfg)

	ca, err := pki.NewAuthority()
	require.NoError(t, err)
	signer := &pki.Signer{Kube: admin, CA: func() (*pki.KeyPair, error) { return ca.State.Current, nil }, Now: time.Now,
		Policy: pki.SigningPolicy{Requester: requester, NodeAddresses: func(name string) ([]net.IP, error) {
			n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			var ips []net.IP
			for _, a := range n.Status.Addresses {
				if ip := net.ParseIP(a.Address); ip != nil {
					ips = append(ips, ip)
				}
			}
			return ips, nil
		}}}
	signerCtx, stopSigner := context.WithCancel(ctx)
	defer stopSigner()
	go signer.Run(signerCtx, logrus.StandardLogger())

	addressA := nodeA.Status.Addresses[0].Address
	own := pki.Identity{Component: pki.ComponentInstanceManager, Node: nodeA.Name}
	issued, err := pki.RequestIdentity(ctx, asNodeA, own, []string{addressA}, ca.State.Bundle, time.Now())
	require.NoError(t, err, "node A's identity for a token bound to node A")
	got, err := pki.IdentityOf(issued.TLS.Leaf)
	require.NoError(t, err)
	assert.Equal(t, own, got)
	assert.NoError(t, issued.TLS.Leaf.VerifyHostname(addressA))
	assert.True(t, issued.Issuer.Equal(ca.State.Current.Cert))

	other := pki.Identity{Component: pki.ComponentInstanceManager, Node: nodeB.Name}
	_, err = pki.RequestIdentity(ctx, asNodeA, other, nil, ca.State.Bundle, time.Now())
	require.Error(t, err, "node B's identity for a token bound to node A")
	assert.Contains(t, err.Error(), "denied")
	csrs, err := admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	var reasons []string
	for _, c := range csrs.Items {
		for _, cond := range c.Status.Conditions {
			if c.Spec.SignerName == pki.SignerName && cond.Type == certificatesv1.CertificateDenied {
				reasons = append(reasons, cond.Message)
			}
		}
	}
	require.Len(t, reasons, 1)
	assert.Contains(t, reasons[0], "the requester's token is bound to node "+nodeA.Name)
}
