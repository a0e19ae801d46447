package deployed

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

// The chart's CA signer (Deployment strata-ca-signer) signs a manager's
// request for its own node only (issue 46): the managers' token bound to
// the manager Pod on node A — what that Pod holds — gets node A's
// instance-manager identity for its own key, and is denied node B's; an
// unbound token of the same ServiceAccount is denied any.
func testSignerBindsRequestsToTheTokensNode(t *testing.T) {
	logsOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pods, err := env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=strata-manager"})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(pods.Items), 2)
	podA, nodeB := pods.Items[0], pods.Items[1].Spec.NodeName
	nodeA := podA.Spec.NodeName
	require.NotEqual(t, nodeA, nodeB)
	node, err := env.kube.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
	require.NoError(t, err)
	var addressA string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			addressA = a.Address
		}
	}
	require.NotEmpty(t, addressA)

	managerToken := func(bound *authenticationv1.BoundObjectReference) kubernetes.Interface {
		ttl := int64(10 * time.Minute / time.Second)
		tr, err := env.kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, types.ManagerServiceAccount,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl, BoundObjectRef: bound}},
			metav1.CreateOptions{})
		require.NoError(t, err)
		cfg := rest.AnonymousClientConfig(env.cluster.AdminConfig)
		cfg.BearerToken, cfg.UserAgent = tr.Status.Token, "deployed.test/signer"
		return kubernetes.NewForConfigOrDie(cfg)
	}
	asPodA := managerToken(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: podA.Name, UID: podA.UID})
	unbound := managerToken(nil)
	csrs := env.kube.CertificatesV1().CertificateSigningRequests()
	before, err := csrs.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	// This test's requests: made since, by the managers' ServiceAccount,
	// from node A's Pod or no node (a manager's renewal from node A's
	// keeper would be settled already; removing it loses nothing).
	ours := func(c certificatesv1.CertificateSigningRequest) bool {
		node := c.Spec.Extra[pki.NodeNameExtra]
		return c.Spec.SignerName == pki.SignerName && (len(node) == 0 || node[0] == nodeA) &&
			!slices.ContainsFunc(before.Items, func(b certificatesv1.CertificateSigningRequest) bool { return b.Name == c.Name })
	}
	t.Cleanup(func() {
		list, err := csrs.List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return
		}
		for _, c := range list.Items {
			if ours(c) {
				_ = csrs.Delete(context.Background(), c.Name, metav1.DeleteOptions{})
			}
		}
	})
	cm, err := env.kube.CoreV1().ConfigMaps(ns).Get(ctx, types.CABundleConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	trust, err := pki.ParseTrust(cm.Data)
	require.NoError(t, err)
	request := func(kube kubernetes.Interface, id pki.Identity, hosts ...string) (*pki.IssuedCert, error) {
		return pki.RequestIdentity(ctx, kube, id, hosts, trust.Bundle, time.Now())
	}

	own := pki.Identity{Component: pki.ComponentInstanceManager, Node: nodeA}
	issued, err := request(asPodA, own, addressA)
	require.NoError(t, err, "node A's identity for node A's manager Pod")
	got, err := pki.IdentityOf(issued.TLS.Leaf)
	require.NoError(t, err)
	assert.Equal(t, own, got)
	assert.NoError(t, issued.TLS.Leaf.VerifyHostname(addressA))
	assert.True(t, issued.Issuer.Equal(trust.Signing), "signed by the CA the signer publishes as signing")

	_, err = request(asPodA, pki.Identity{Component: pki.ComponentInstanceManager, Node: nodeB})
	require.Error(t, err, "node B's identity for node A's manager Pod")
	assert.Contains(t, err.Error(), "denied")
	assert.Contains(t, err.Error(), "the requester's token is bound to node "+nodeA)

	_, err = request(unbound, own)
	require.Error(t, err, "an unbound token of the managers' ServiceAccount")
	assert.Contains(t, err.Error(), "bound to no node")

	// The denials say why, in the requests' Denied conditions.
	list, err := csrs.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	var denied []string
	for _, r := range list.Items {
		for _, c := range r.Status.Conditions {
			if ours(r) && c.Type == certificatesv1.CertificateDenied {
				denied = append(denied, c.Reason+": "+c.Message)
			}
		}
	}
	assert.Len(t, denied, 2, "%v", denied)
	t.Logf("denied: %v", denied)
}
