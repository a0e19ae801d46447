package deployed

import (
	"context"
	"crypto/x509"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook"
)

// The CA is rotated while a Pod writes to a claim (issue 24), as an admin
// asks for it (kubectl annotate secret strata-webhook-ca
// strata.io/rotate-ca=now): the Pod sees no I/O error and its writes go on,
// every node's instance manager moves to a certificate of the new CA (the
// files its node's manager writes into the chart's hostDir/tls, on this
// host), connections made after the rotation work (a manager certificate
// of the new CA reaches every instance manager's gRPC; a new claim's
// engine dials its replicas with the new certificates), and every chunk the
// Pod wrote reads back — though the CA signer is killed in the middle of
// it. (Moved from test/e2e.)
//
// Not one of TestUserFlows: the CA is what every component's connections,
// the webhooks' caBundle and the client certificates other flows issue
// from the Secret stand on, so the rotation runs alone, after them (this
// file sorts after flows_test.go).
func TestCertificateRotationWhileAPodWrites(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	claim(t, "rot-w", "")
	pod(t, "rot-w", "127.0.0.2", "rot-w", writer)
	waitWrites(t, "rot-w", 5, "from the start")
	volume := volumeOfClaim(t, "rot-w")
	require.Equal(t, "127.0.0.2", getVolume(t, volume).Status.CurrentNodeID)

	old, err := caState(ctx)
	require.NoError(t, err)
	// A manager certificate of the CA before the rotation, as a thief who
	// took that CA's key would make: refused everywhere once the rotation
	// has retired the old CA (issue 46).
	stolen, err := pki.SourceFromSecret(ctx, env.kube, ns, pki.Identity{Component: pki.ComponentManager, Node: "stolen"})
	require.NoError(t, err)
	kubectl(t, "-n", ns, "annotate", "secret", pki.CASecretName, pki.AnnotationRotateCA+"=now")
	start := time.Now()
	// The CA signer is killed (SIGKILL) in the rotation, once its first
	// phase is in the Secret: the restarted container (the same Pod, so the
	// same name in the Lease, taken back at once) finishes the rotation
	// from the Secret.
	require.Eventually(t, func() bool {
		st, err := caState(ctx)
		return err == nil && st.Next != nil
	}, time.Minute, 100*time.Millisecond, "phase 1: a next CA in the Secret")
	killed := 0
	for _, p := range hostProcesses(t) {
		if p.inPod && signerCmdline.MatchString(p.cmdline) {
			require.NoError(t, syscall.Kill(p.pid, syscall.SIGKILL))
			killed++
		}
	}
	require.Equal(t, 1, killed, "the CA signer's process")
	var current *x509.Certificate
	require.Eventually(t, func() bool {
		st, err := caState(ctx)
		if err != nil || st.Current.Cert.Equal(old.Current.Cert) || st.Next != nil {
			return false
		}
		current = st.Current.Cert
		return true
	}, 2*time.Minute, 200*time.Millisecond, "the new CA is promoted")
	for _, node := range env.nodes {
		dir := tlsDir(t, node)
		require.Eventually(t, func() bool {
			cert, _, err := pki.ReadDir(dir)
			return err == nil && cert.Leaf.CheckSignatureFrom(current) == nil
		}, time.Minute, 200*time.Millisecond, "%s's instance manager holds a certificate of the new CA", node)
	}
	t.Logf("CA rotated and every instance manager re-issued in %s", time.Since(start).Round(time.Millisecond))
	waitWrites(t, "rot-w", 10, "after the rotation")

	// New connections after the rotation: gRPC with a manager certificate
	// of the new CA to every instance manager, and a new claim whose
	// engine dials its replicas.
	manager, err := pki.SourceFromSecret(ctx, env.kube, ns, pki.Identity{Component: pki.ComponentManager, Node: "deployed-test"})
	require.NoError(t, err)
	issued, err := manager.Certificate()
	require.NoError(t, err)
	require.NoError(t, issued.Leaf.CheckSignatureFrom(current), "issued by the new CA")
	endpoints := instanceManagerEndpoints(t)
	require.Len(t, endpoints, len(env.nodes), "an instance manager per node: %v", endpoints)
	for node, endpoint := range endpoints {
		c, err := engineapi.NewClient(endpoint, 10*time.Second, pki.ClientConfig(manager, pki.ComponentInstanceManager))
		require.NoError(t, err)
		_, err = c.InstanceList(ctx)
		c.Close()
		require.NoError(t, err, "%s's instance manager at %s takes a certificate of the new CA", node, endpoint)
	}
	claim(t, "rot-fresh", "")
	pod(t, "rot-fresh", "127.0.0.1", "rot-fresh", "exec sleep 3600")
	// O_DIRECT both ways: the data goes through the engine and its
	// replicas, not the page cache.
	wrote := exec1(t, "rot-fresh", "dd if=/dev/urandom of=/tmp/f bs=1M count=4 2>/dev/null && "+
		"dd if=/tmp/f of=/data/f bs=1M oflag=direct conv=fsync 2>/dev/null && sha256sum /tmp/f | cut -d' ' -f1")
	require.Len(t, wrote, 64, "a sha256 of the written data: %q", wrote)
	assert.Equal(t, wrote, exec1(t, "rot-fresh", "dd if=/data/f bs=1M iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1"))
	waitVolumeStatus(t, volumeOfClaim(t, "rot-fresh"), time.Minute, "healthy", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy
	})

	t.Logf("%d chunks written and verified across the rotation", stopAndVerify(t, "rot-w"))

	// The end of the rotation: the old CA leaves the Secret's bundle, every
	// instance manager's and the webhooks' trust, and its certificate is
	// refused by every instance manager (a gRPC call fails in the handshake).
	require.Eventually(t, func() bool {
		st, err := caState(ctx)
		return err == nil && len(st.Bundle) == 1 && st.Bundle[0].Equal(current)
	}, 3*time.Minute, time.Second, "the old CA is retired from the Secret's bundle")
	t.Logf("the old CA retired %s after the rotation began", time.Since(start).Round(time.Second))
	for _, node := range env.nodes {
		dir := tlsDir(t, node)
		require.Eventually(t, func() bool {
			_, bundle, err := pki.ReadDir(dir)
			return err == nil && len(bundle) == 1 && bundle[0].Equal(current)
		}, time.Minute, 200*time.Millisecond, "%s's instance manager trusts the new CA alone", node)
	}
	// The leader applies the configurations on its pass after the
	// Secret's write.
	require.Eventually(t, func() bool {
		vc, err := env.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ValidatorConfigName, metav1.GetOptions{})
		if err != nil || len(vc.Webhooks) == 0 {
			return false
		}
		cas, err := pki.ParseCerts(vc.Webhooks[0].ClientConfig.CABundle)
		return err == nil && len(cas) == 1 && cas[0].Equal(current)
	}, time.Minute, 200*time.Millisecond, "the API server trusts the new CA alone")
	for node, endpoint := range endpoints {
		c, err := engineapi.NewClient(endpoint, 10*time.Second, pki.ClientConfig(withTrust(t, stolen, current), pki.ComponentInstanceManager))
		if err == nil {
			_, err = c.InstanceList(ctx)
			c.Close()
		}
		require.Error(t, err, "%s's instance manager refuses a certificate of the retired CA", node)
	}
}

// withTrust is src's certificate with roots of ca: a client that trusts the
// cluster's current CA, so that only its own certificate can be refused.
func withTrust(t *testing.T, src *pki.MemorySource, ca *x509.Certificate) *pki.MemorySource {
	t.Helper()
	var m pki.MemorySource
	m.Set(src.Issued(), []*x509.Certificate{ca})
	return &m
}

// signerCmdline is the CA signer's process (/proc/<pid>/cmdline).
var signerCmdline = regexp.MustCompile(`strata-manager\x00ca-signer\x00`)

// caState is the CA Secret's state, read as an admin reads the Secret.
func caState(ctx context.Context) (*pki.CAState, error) {
	secret, err := env.kube.CoreV1().Secrets(ns).Get(ctx, pki.CASecretName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return pki.ParseCAState(secret.Data)
}

// instanceManagerEndpoints maps each node to its instance manager's gRPC
// address, from the InstanceManager objects.
func instanceManagerEndpoints(t *testing.T) map[string]string {
	t.Helper()
	list, err := env.strata.StrataV1beta1().InstanceManagers(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	out := map[string]string{}
	for _, im := range list.Items {
		if im.Status.Endpoint != "" {
			out[im.Spec.NodeID] = im.Status.Endpoint
		}
	}
	return out
}
