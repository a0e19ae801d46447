package webhook

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

const day = 24 * time.Hour

// verifies tells whether the serving certificate is trusted by the bundle at
// now for the Service's DNS name, as the API server would check it.
func verifies(t *testing.T, s *ServingCerts, bundle []byte, now time.Time, host string) error {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(bundle))
	cert, err := s.GetCertificate(nil)
	require.NoError(t, err)
	_, err = cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, DNSName: host,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

func TestCAStateRoundTripsThroughTheSecret(t *testing.T) {
	state, err := newCAState(t0)
	require.NoError(t, err)
	data, err := state.secretData()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{keyCACert, keyCAKey, keyBundle}, keys(data))

	parsed, err := parseCAState(data)
	require.NoError(t, err)
	assert.True(t, parsed.current.cert.Equal(state.current.cert))
	assert.True(t, parsed.current.key.Equal(state.current.key))
	assert.Nil(t, parsed.next)
	assert.Equal(t, state.bundlePEM(), parsed.bundlePEM())
	assert.True(t, state.current.cert.IsCA)
	assert.Equal(t, t0.Add(CAValidity), state.current.cert.NotAfter)
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestParseCAStateRejectsDamage(t *testing.T) {
	a, err := newCAState(t0)
	require.NoError(t, err)
	b, err := newCAState(t0)
	require.NoError(t, err)
	good, err := a.secretData()
	require.NoError(t, err)
	other, err := b.secretData()
	require.NoError(t, err)

	tests := []struct {
		name    string
		edit    func(map[string][]byte)
		wantErr string
	}{
		{"no certificate", func(d map[string][]byte) { delete(d, keyCACert) }, "ca.crt/ca.key: want one certificate, found 0"},
		{"no key", func(d map[string][]byte) { delete(d, keyCAKey) }, "ca.crt/ca.key: no PEM private key"},
		{"another CA's key", func(d map[string][]byte) { d[keyCAKey] = other[keyCAKey] },
			"ca.crt/ca.key: the private key does not match the certificate"},
		{"a next CA without its key", func(d map[string][]byte) { d[keyNextCert] = other[keyCACert] },
			"next-ca.crt/next-ca.key: no PEM private key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := map[string][]byte{}
			for k, v := range good {
				d[k] = v
			}
			tc.edit(d)
			_, err := parseCAState(d)
			assert.EqualError(t, err, tc.wantErr)
		})
	}

	t.Run("a lost bundle is rebuilt from the CA in use", func(t *testing.T) {
		d := map[string][]byte{keyCACert: good[keyCACert], keyCAKey: good[keyCAKey]}
		s, err := parseCAState(d)
		require.NoError(t, err)
		assert.Equal(t, good[keyBundle], s.bundlePEM())
	})
}

// A whole rotation, step by step, with the serving certificate of a manager
// that follows the Secret: at every step the API server (which trusts the
// bundle) accepts the certificate the manager serves.
func TestRotationNeverCutsOffAManager(t *testing.T) {
	const rotateBefore = 30 * day
	clk := clocktesting.NewFakeClock(t0)
	state, err := newCAState(t0)
	require.NoError(t, err)
	oldCA := state.current.cert
	certs := NewServingCerts(servingHosts("strata-system"), clk)
	host := "strata-webhook.strata-system.svc"

	reissued, err := certs.Refresh(state)
	require.NoError(t, err)
	require.True(t, reissued)
	require.NoError(t, verifies(t, certs, state.bundlePEM(), clk.Now(), host))

	// Not due yet: nothing changes.
	clk.SetTime(oldCA.NotAfter.Add(-rotateBefore - time.Minute))
	changed, err := state.rotate(clk.Now(), rotateBefore)
	require.NoError(t, err)
	assert.False(t, changed)

	// Phase 1: the next CA joins the bundle; serving still uses the current one.
	clk.SetTime(oldCA.NotAfter.Add(-rotateBefore))
	changed, err = state.rotate(clk.Now(), rotateBefore)
	require.NoError(t, err)
	require.True(t, changed)
	require.NotNil(t, state.next)
	assert.Len(t, state.bundle, 2)
	assert.True(t, state.current.cert.Equal(oldCA), "the current CA still signs")
	changed, err = state.rotate(clk.Now().Add(time.Hour), rotateBefore)
	require.NoError(t, err)
	assert.False(t, changed, "one rotation at a time")

	// The serving certificate, renewed on its own schedule, still comes from
	// the old CA and is trusted.
	_, err = certs.Refresh(state)
	require.NoError(t, err)
	require.NoError(t, verifies(t, certs, state.bundlePEM(), clk.Now(), host))

	// Phase 2: the next CA becomes current; the manager re-issues from it;
	// the old CA stays in the bundle for managers that have not yet.
	state.promote()
	assert.Nil(t, state.next)
	assert.False(t, state.current.cert.Equal(oldCA))
	assert.Len(t, state.bundle, 2)
	require.NoError(t, verifies(t, certs, state.bundlePEM(), clk.Now(), host), "an old-CA certificate is still trusted")
	reissued, err = certs.Refresh(state)
	require.NoError(t, err)
	assert.True(t, reissued, "a new CA means a new serving certificate")
	require.NoError(t, verifies(t, certs, state.bundlePEM(), clk.Now(), host))
	cert, _ := certs.GetCertificate(nil)
	assert.True(t, cert.Leaf.CheckSignatureFrom(state.current.cert) == nil, "signed by the new CA")

	// Once the old CA has expired it leaves the bundle.
	clk.SetTime(oldCA.NotAfter.Add(time.Second))
	changed, err = state.rotate(clk.Now(), rotateBefore)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Len(t, state.bundle, 1)
	assert.True(t, state.bundle[0].Equal(state.current.cert))
	require.NoError(t, verifies(t, certs, state.bundlePEM(), clk.Now(), host))
}

func TestAnExpiredCAIsReplacedAtOnce(t *testing.T) {
	state, err := newCAState(t0)
	require.NoError(t, err)
	old := state.current.cert
	later := old.NotAfter.Add(day)
	changed, err := state.rotate(later, 30*day)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Nil(t, state.next)
	assert.False(t, state.current.cert.Equal(old))
	assert.Len(t, state.bundle, 1, "the expired CA is dropped")
	assert.True(t, later.Before(state.current.cert.NotAfter))
}

func TestServingCertificate(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	state, err := newCAState(t0)
	require.NoError(t, err)
	certs := NewServingCerts(servingHosts("strata-system", "127.0.0.1", "10.1.2.3", "0.0.0.0", "", "node-1.example"), clk)
	_, err = certs.GetCertificate(nil)
	assert.EqualError(t, err, "no serving certificate yet")

	_, err = certs.Refresh(state)
	require.NoError(t, err)
	cert, err := certs.GetCertificate(nil)
	require.NoError(t, err)
	leaf := cert.Leaf
	assert.ElementsMatch(t, []string{"localhost", "strata-webhook.strata-system.svc",
		"strata-webhook.strata-system.svc.cluster.local", "node-1.example"}, leaf.DNSNames)
	var ips []string
	for _, ip := range leaf.IPAddresses {
		ips = append(ips, ip.String())
	}
	assert.ElementsMatch(t, []string{"127.0.0.1", "10.1.2.3"}, ips)
	assert.Equal(t, t0.Add(servingValidity), leaf.NotAfter)
	for _, host := range []string{"127.0.0.1", "10.1.2.3", "strata-webhook.strata-system.svc.cluster.local"} {
		assert.NoError(t, verifies(t, certs, state.bundlePEM(), t0, host), host)
	}

	// Unchanged CA, not due: the same certificate.
	clk.Step(servingValidity / 2)
	reissued, err := certs.Refresh(state)
	require.NoError(t, err)
	assert.False(t, reissued)
	// Two thirds into its life: renewed.
	clk.SetTime(certs.RenewAt())
	reissued, err = certs.Refresh(state)
	require.NoError(t, err)
	assert.True(t, reissued)
	next, _ := certs.GetCertificate(nil)
	assert.NotEqual(t, leaf.SerialNumber, next.Leaf.SerialNumber)

	// Near the CA's end, a certificate never outlives its CA.
	clk.SetTime(state.current.cert.NotAfter.Add(-10 * day))
	_, err = certs.Refresh(state)
	require.NoError(t, err)
	last, _ := certs.GetCertificate(nil)
	assert.Equal(t, state.current.cert.NotAfter, last.Leaf.NotAfter)
}
