package apiclient

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The API gets the kubeconfig's token when it has one (or --token's), else
// its client certificate; a user with neither is told to pass --token.
func TestAPIConfig(t *testing.T) {
	certUser := &rest.Config{Host: "https://k8s", TLSClientConfig: rest.TLSClientConfig{
		CertData: []byte("c"), KeyData: []byte("k"), CAData: []byte("cluster-ca")}}
	cfg, err := Config(certUser, []byte("ca"), "")
	require.NoError(t, err)
	assert.Equal(t, []byte("c"), cfg.CertData, "the certificate authenticates the user")
	assert.Equal(t, []byte("k"), cfg.KeyData)
	assert.Equal(t, []byte("ca"), cfg.CAData, "the API's server certificate is Strata's")
	assert.Empty(t, cfg.BearerToken)

	cfg, err = Config(certUser, []byte("ca"), "tok")
	require.NoError(t, err)
	assert.Equal(t, "tok", cfg.BearerToken)
	assert.Empty(t, cfg.CertData, "--token wins: the certificate stays with the API server")

	tokenUser := &rest.Config{Host: "https://k8s", BearerToken: "kube-token", TLSClientConfig: rest.TLSClientConfig{CertData: []byte("c")}}
	cfg, err = Config(tokenUser, []byte("ca"), "")
	require.NoError(t, err)
	assert.Equal(t, "kube-token", cfg.BearerToken)
	assert.Empty(t, cfg.CertData)

	_, err = Config(&rest.Config{Host: "https://k8s", Username: "u", Password: "p"}, []byte("ca"), "")
	require.ErrorIs(t, err, ErrNoCredentials)
}

// The first ready node by name that serves the API is asked.
func TestReadyAddress(t *testing.T) {
	node := func(name, addr string, ready metav1.ConditionStatus) *v1beta1.Node {
		return &v1beta1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1beta1.NodeStatus{APIAddress: addr,
			Conditions: []metav1.Condition{{Type: v1beta1.ConditionTypeReady, Status: ready}}}}
	}
	assert.Equal(t, "10.0.0.2:9501", ReadyAddress([]*v1beta1.Node{node("n3", "10.0.0.3:9501", metav1.ConditionTrue),
		node("n1", "10.0.0.1:9501", metav1.ConditionFalse), node("n2", "10.0.0.2:9501", metav1.ConditionTrue),
		node("n0", "", metav1.ConditionTrue)}))
	assert.Empty(t, ReadyAddress(nil))
}
