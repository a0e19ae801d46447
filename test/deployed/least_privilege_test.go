package deployed

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

// The managers' token, which sits on every node in a root host-network
// container, opens no door beyond Strata's own (issue 46): it impersonates
// nobody (system:masters least of all), lists no Secret and reads only the
// Secrets it names, and creates no webhook configuration (the chart
// creates Strata's two; the token may only patch those).
func testManagerTokenOpensNoOtherDoor(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	ttl := int64(10 * time.Minute / time.Second)
	tr, err := env.kube.CoreV1().ServiceAccounts(types.DefaultNamespace).CreateToken(ctx, types.ManagerServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	require.NoError(t, err)
	managerConfig := rest.AnonymousClientConfig(env.cluster.AdminConfig)
	managerConfig.BearerToken = tr.Status.Token
	manager := kubernetes.NewForConfigOrDie(managerConfig)
	as := func(user string, groups ...string) kubernetes.Interface {
		cfg := rest.CopyConfig(managerConfig)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	listSecrets := func(c kubernetes.Interface, namespace string) func() error {
		return func() error {
			_, err := c.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{})
			return err
		}
	}
	webhook := func(name string) func() error {
		return func() error {
			_, err := manager.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
				&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			return err
		}
	}
	for _, tc := range []struct {
		name      string
		call      func() error
		forbidden bool
	}{
		{"impersonate system:masters", listSecrets(as("x", "system:masters"), ""), true},
		{"impersonate a user", listSecrets(as("kubernetes-admin"), ""), true},
		{"impersonate the CSI controller", listSecrets(as("system:serviceaccount:strata-system:strata-csi-controller"), types.DefaultNamespace), true},
		{"list every Secret", listSecrets(manager, ""), true},
		{"list Strata's Secrets", listSecrets(manager, types.DefaultNamespace), true},
		{"read a Secret it does not name", func() error {
			_, err := manager.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-abcdef", metav1.GetOptions{})
			return err
		}, true},
		{"read the CA Secret it names", func() error {
			_, err := manager.CoreV1().Secrets(types.DefaultNamespace).Get(ctx, pki.CASecretName, metav1.GetOptions{})
			return err
		}, false},
		{"create a webhook configuration", webhook("strata-evil"), true},
		{"create Strata's own webhook configuration", webhook("strata-validator"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if tc.forbidden {
				assert.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
				return
			}
			assert.NoError(t, err)
		})
	}
}
