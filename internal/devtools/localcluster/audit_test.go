package localcluster

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"sigs.k8s.io/yaml"
)

// The audit policy logs the named users and groups at Metadata, no
// RequestReceived stage, and nothing of anyone else.
func TestAuditPolicy(t *testing.T) {
	b, err := AuditOptions{Users: []string{"system:serviceaccount:kube-system:snapshot-controller"},
		Groups: []string{"system:serviceaccounts:strata-system"}}.auditPolicy()
	require.NoError(t, err)
	var p auditv1.Policy
	require.NoError(t, yaml.UnmarshalStrict(b, &p))
	assert.Equal(t, "audit.k8s.io/v1", p.APIVersion)
	assert.Equal(t, "Policy", p.Kind)
	assert.Equal(t, []auditv1.Stage{auditv1.StageRequestReceived}, p.OmitStages)
	assert.Equal(t, []auditv1.PolicyRule{
		{Level: auditv1.LevelMetadata, Users: []string{"system:serviceaccount:kube-system:snapshot-controller"}},
		{Level: auditv1.LevelMetadata, UserGroups: []string{"system:serviceaccounts:strata-system"}},
		{Level: auditv1.LevelNone},
	}, p.Rules)
}
