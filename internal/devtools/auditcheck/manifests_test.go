package auditcheck

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shipped RBAC parses, names no wildcard, reads Secrets by name only,
// and gives the CSI node plugin nothing: what the end-to-end audit check
// holds against the audit log, checked here without a cluster.
func TestShippedManifests(t *testing.T) {
	r, err := LoadManifests(filepath.Join("..", "..", "..", "package", "manifests"))
	require.NoError(t, err)
	for _, sa := range []string{"strata-system/strata-manager", "strata-system/strata-csi-controller",
		"strata-system/strata-csi-node", "strata-system/strata-signer", "kube-system/snapshot-controller"} {
		assert.Contains(t, r.ServiceAccounts, sa)
	}
	for _, sa := range [][2]string{{"strata-system", "strata-manager"}, {"strata-system", "strata-csi-controller"},
		{"strata-system", "strata-signer"}, {"kube-system", "snapshot-controller"}} {
		grants, err := r.GrantsOf(sa[0], sa[1])
		require.NoError(t, err)
		assert.NotEmpty(t, grants, sa)
		for _, g := range grants {
			assert.False(t, g.Wildcard(), "%s: %s", sa, g)
			if g.Group == "" && g.Resource == "secrets" && g.Verb != "create" {
				assert.NotEmpty(t, g.ResourceNames, "%s: Secrets are read by name only: %s", sa, g)
			}
		}
	}
	grants, err := r.GrantsOf("strata-system", "strata-csi-node")
	require.NoError(t, err)
	assert.Empty(t, grants, "the node plugin makes no API call")
}
