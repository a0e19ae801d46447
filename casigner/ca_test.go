package casigner

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/strata-storage/strata/internal/pki"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

const day = 24 * time.Hour

// servingCerts keeps a serving certificate current as a component does:
// re-issued when the CA changes or it is due.
type servingCerts struct {
	hosts []string
	clock clock.PassiveClock
	cur   *servingCert
}

func newServingCerts(hosts []string, clk clock.PassiveClock) *servingCerts {
	return &servingCerts{hosts: hosts, clock: clk}
}

func (s *servingCerts) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.cur == nil {
		return nil, errors.New("no serving certificate yet")
	}
	return s.cur.cert, nil
}

func (s *servingCerts) Refresh(state *pki.CAState) (bool, error) {
	now := s.clock.Now()
	if s.cur != nil && !s.cur.due(state, nil, now) {
		return false, nil
	}
	c, err := issueServing(state.Current, "strata-webhook", s.hosts, now)
	if err != nil {
		return false, err
	}
	s.cur = c
	return true, nil
}

func (s *servingCerts) RenewAt() time.Time { return s.cur.renewAt }

// verifies tells whether the serving certificate is trusted by the bundle at
// now for the Service's DNS name, as the API server would check it.
func verifies(t *testing.T, s *servingCerts, bundle []byte, now time.Time, host string) error {
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
	state, err := pki.NewCAState(t0)
	require.NoError(t, err)
	data, err := state.SecretData()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{pki.KeyCACert, pki.KeyCAKey, pki.KeyBundle}, keys(data))

	parsed, err := pki.ParseCAState(data)
	require.NoError(t, err)
	assert.True(t, parsed.Current.Cert.Equal(state.Current.Cert))
	assert.True(t, parsed.Current.Key.Equal(state.Current.Key))
	assert.Nil(t, parsed.Next)
	assert.Equal(t, state.BundlePEM(), parsed.BundlePEM())
	assert.True(t, state.Current.Cert.IsCA)
	assert.Equal(t, t0.Add(pki.CAValidity), state.Current.Cert.NotAfter)
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestParseCAStateRejectsDamage(t *testing.T) {
	a, err := pki.NewCAState(t0)
	require.NoError(t, err)
	b, err := pki.NewCAState(t0)
	require.NoError(t, err)
	good, err := a.SecretData()
	require.NoError(t, err)
	other, err := b.SecretData()
	require.NoError(t, err)

	tests := []struct {
		name    string
		edit    func(map[string][]byte)
		wantErr string
	}{
		{"no certificate", func(d map[string][]byte) { delete(d, pki.KeyCACert) }, "ca.crt/ca.key: want one certificate, found 0"},
		{"no key", func(d map[string][]byte) { delete(d, pki.KeyCAKey) }, "ca.crt/ca.key: no PEM private key"},
		{"another CA's key", func(d map[string][]byte) { d[pki.KeyCAKey] = other[pki.KeyCAKey] },
			"ca.crt/ca.key: the private key does not match the certificate"},
		{"a next CA without its key", func(d map[string][]byte) { d[pki.KeyNextCert] = other[pki.KeyCACert] },
			"next-ca.crt/next-ca.key: no PEM private key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := map[string][]byte{}
			for k, v := range good {
				d[k] = v
			}
			tc.edit(d)
			_, err := pki.ParseCAState(d)
			assert.EqualError(t, err, tc.wantErr)
		})
	}

	t.Run("a lost bundle is rebuilt from the CA in use", func(t *testing.T) {
		d := map[string][]byte{pki.KeyCACert: good[pki.KeyCACert], pki.KeyCAKey: good[pki.KeyCAKey]}
		s, err := pki.ParseCAState(d)
		require.NoError(t, err)
		assert.Equal(t, good[pki.KeyBundle], s.BundlePEM())
	})
}

// A whole rotation, step by step, with the serving certificate of a manager
// that follows the Secret: at every step the API server (which trusts the
// bundle) accepts the certificate the manager serves.
func TestRotationNeverCutsOffAManager(t *testing.T) {
	const rotateBefore = 30 * day
	clk := clocktesting.NewFakeClock(t0)
	state, err := pki.NewCAState(t0)
	require.NoError(t, err)
	oldCA := state.Current.Cert
	certs := newServingCerts([]string{"strata-webhook.strata-system.svc"}, clk)
	host := "strata-webhook.strata-system.svc"

	reissued, err := certs.Refresh(state)
	require.NoError(t, err)
	require.True(t, reissued)
	require.NoError(t, verifies(t, certs, state.BundlePEM(), clk.Now(), host))

	// Not due yet: nothing changes.
	clk.SetTime(oldCA.NotAfter.Add(-rotateBefore - time.Minute))
	changed, err := state.Rotate(clk.Now(), rotateBefore)
	require.NoError(t, err)
	assert.False(t, changed)

	// Phase 1: the next CA joins the bundle; serving still uses the current one.
	clk.SetTime(oldCA.NotAfter.Add(-rotateBefore))
	changed, err = state.Rotate(clk.Now(), rotateBefore)
	require.NoError(t, err)
	require.True(t, changed)
	require.NotNil(t, state.Next)
	assert.Len(t, state.Bundle, 2)
	assert.True(t, state.Current.Cert.Equal(oldCA), "the current CA still signs")
	changed, err = state.Rotate(clk.Now().Add(time.Hour), rotateBefore)
	require.NoError(t, err)
	assert.False(t, changed, "one rotation at a time")

	// The serving certificate, renewed on its own schedule, still comes from
	// the old CA and is trusted.
	_, err = certs.Refresh(state)
	require.NoError(t, err)
	require.NoError(t, verifies(t, certs, state.BundlePEM(), clk.Now(), host))

	// Phase 2: the next CA becomes current; the manager re-issues from it;
	// the old CA stays in the bundle for managers that have not yet.
	state.Promote(clk.Now())
	assert.Nil(t, state.Next)
	assert.False(t, state.Current.Cert.Equal(oldCA))
	assert.Len(t, state.Bundle, 2)
	require.NoError(t, verifies(t, certs, state.BundlePEM(), clk.Now(), host), "an old-CA certificate is still trusted")
	reissued, err = certs.Refresh(state)
	require.NoError(t, err)
	assert.True(t, reissued, "a new CA means a new serving certificate")
	require.NoError(t, verifies(t, certs, state.BundlePEM(), clk.Now(), host))
	cert, _ := certs.GetCertificate(nil)
	assert.True(t, cert.Leaf.CheckSignatureFrom(state.Current.Cert) == nil, "signed by the new CA")

	// Phase 3: the old CA is retired from the bundle retireAfter later.
	assert.Equal(t, clk.Now().Add(retireAfter), state.RetireDue(retireAfter))
	assert.True(t, state.Retire())
	assert.Len(t, state.Bundle, 1)
	assert.True(t, state.Bundle[0].Equal(state.Current.Cert))
	require.NoError(t, verifies(t, certs, state.BundlePEM(), clk.Now(), host))

	// Until the next rotation, nothing changes, the old CA's expiry included.
	clk.SetTime(oldCA.NotAfter.Add(time.Second))
	changed, err = state.Rotate(clk.Now(), rotateBefore)
	require.NoError(t, err)
	assert.False(t, changed)
}

func TestAnExpiredCAIsReplacedAtOnce(t *testing.T) {
	state, err := pki.NewCAState(t0)
	require.NoError(t, err)
	old := state.Current.Cert
	later := old.NotAfter.Add(day)
	changed, err := state.Rotate(later, 30*day)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Nil(t, state.Next)
	assert.False(t, state.Current.Cert.Equal(old))
	assert.Len(t, state.Bundle, 1, "the expired CA is dropped")
	assert.True(t, later.Before(state.Current.Cert.NotAfter))
}

func TestServingCertificate(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	state, err := pki.NewCAState(t0)
	require.NoError(t, err)
	certs := newServingCerts([]string{"127.0.0.1", "localhost", "strata-webhook.strata-system.svc", "strata-webhook.strata-system.svc.cluster.local", "10.1.2.3", "node-1.example"}, clk)
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
		assert.NoError(t, verifies(t, certs, state.BundlePEM(), t0, host), host)
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
	clk.SetTime(state.Current.Cert.NotAfter.Add(-10 * day))
	_, err = certs.Refresh(state)
	require.NoError(t, err)
	last, _ := certs.GetCertificate(nil)
	assert.Equal(t, state.Current.Cert.NotAfter, last.Leaf.NotAfter)
}
