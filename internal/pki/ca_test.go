package pki

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A rotation ends with the replaced CA gone from the bundle: a certificate
// it signed (a stolen key's, the reason to rotate) is trusted through the
// rotation, so that no component is cut off while it re-issues, and
// refused once the replaced CA is retired. The retirement's time survives
// the Secret.
func TestARotationRetiresTheReplacedCA(t *testing.T) {
	state := newState(t)
	im := Identity{Component: ComponentInstanceManager, Node: "n1"}
	mgr := Identity{Component: ComponentManager, Node: "n2"}
	oldCert := memSource(t, state, mgr).Issued() // issued by the CA before the rotation
	// stolen presents that certificate and trusts what the cluster trusts.
	stolen := func() *MemorySource {
		var m MemorySource
		m.Set(oldCert, state.Bundle)
		return &m
	}

	started, err := state.StartRotation(t0)
	require.NoError(t, err)
	require.True(t, started)
	assert.True(t, state.RetireDue(time.Minute).IsZero(), "nothing to retire before the promotion")
	promoted := t0.Add(30 * time.Second)
	state.Promote(promoted)
	assert.Equal(t, promoted.Add(time.Minute), state.RetireDue(time.Minute))
	data, err := state.SecretData()
	require.NoError(t, err)
	reread, err := ParseCAState(data)
	require.NoError(t, err)
	assert.Equal(t, promoted.Add(time.Minute).Unix(), reread.RetireDue(time.Minute).Unix(), "kept in the Secret")

	server := func() *MemorySource { return memSource(t, state, im) } // re-issued from the current CA
	require.Len(t, state.Bundle, 2)
	cerr, serr := handshake(t, ServerConfig(server(), ComponentManager), ClientConfig(stolen(), ComponentInstanceManager))
	assert.NoError(t, cerr)
	assert.NoError(t, serr, "until it is retired, the old CA's certificate still works")

	require.True(t, state.Retire())
	assert.False(t, state.Retire(), "once")
	require.Len(t, state.Bundle, 1)
	assert.True(t, state.Bundle[0].Equal(state.Current.Cert))
	assert.True(t, state.RetireDue(time.Minute).IsZero())
	_, serr = handshake(t, ServerConfig(server(), ComponentManager), ClientConfig(stolen(), ComponentInstanceManager))
	require.Error(t, serr, "a certificate of the retired CA is refused")
	assert.Contains(t, serr.Error(), "unknown authority")
	cerr, serr = handshake(t, ServerConfig(server(), ComponentManager), ClientConfig(memSource(t, state, mgr), ComponentInstanceManager))
	assert.NoError(t, cerr)
	assert.NoError(t, serr, "the current CA's certificates work")
	data, err = state.SecretData()
	require.NoError(t, err)
	assert.NotContains(t, data, KeyPromotedAt)
}

// A retirement during the next rotation keeps the next CA.
func TestRetireKeepsTheNextCA(t *testing.T) {
	state := newState(t)
	_, err := state.StartRotation(t0)
	require.NoError(t, err)
	state.Promote(t0)
	_, err = state.StartRotation(t0.Add(time.Second))
	require.NoError(t, err)
	require.Len(t, state.Bundle, 3)
	require.True(t, state.Retire())
	require.Len(t, state.Bundle, 2)
	assert.True(t, state.Bundle[0].Equal(state.Current.Cert) || state.Bundle[1].Equal(state.Current.Cert))
	assert.True(t, state.Bundle[0].Equal(state.Next.Cert) || state.Bundle[1].Equal(state.Next.Cert))
}
