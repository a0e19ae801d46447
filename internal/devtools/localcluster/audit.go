package localcluster

import (
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"sigs.k8s.io/yaml"
)

// AuditOptions makes the API server keep an audit log (Cluster.AuditLogPath):
// one JSON object a line, at level Metadata (who, which verb on which
// resource, namespace and name, the response code and the authorizer's
// decision; no bodies), of the requests of the users and groups named and
// no one else's. internal/devtools/auditcheck reads it.
type AuditOptions struct {
	// Users are user names, e.g. system:serviceaccount:kube-system:snapshot-controller.
	Users []string
	// Groups are group names, e.g. system:serviceaccounts:strata-system
	// (every ServiceAccount of that namespace).
	Groups []string
}

// auditPolicy is the audit.k8s.io/v1 Policy for o: one stage fewer than
// the default (RequestReceived says nothing the completion does not), and
// a final rule that logs nothing for everyone else.
func (o AuditOptions) auditPolicy() ([]byte, error) {
	policy := auditv1.Policy{
		TypeMeta:   metav1.TypeMeta{APIVersion: auditv1.SchemeGroupVersion.String(), Kind: "Policy"},
		OmitStages: []auditv1.Stage{auditv1.StageRequestReceived},
	}
	if len(o.Users) > 0 {
		policy.Rules = append(policy.Rules, auditv1.PolicyRule{Level: auditv1.LevelMetadata, Users: o.Users})
	}
	if len(o.Groups) > 0 {
		policy.Rules = append(policy.Rules, auditv1.PolicyRule{Level: auditv1.LevelMetadata, UserGroups: o.Groups})
	}
	policy.Rules = append(policy.Rules, auditv1.PolicyRule{Level: auditv1.LevelNone})
	return yaml.Marshal(policy)
}

// auditFlags writes the policy and returns the API server's flags for it,
// removing the log a previous start left.
func (c *Cluster) auditFlags(o AuditOptions) ([]string, error) {
	policy, err := o.auditPolicy()
	if err != nil {
		return nil, err
	}
	policyPath := c.path("audit-policy.yaml")
	if err := os.WriteFile(policyPath, policy, 0o644); err != nil {
		return nil, err
	}
	c.AuditLogPath = c.path("logs", "audit.log")
	if err := os.Remove(c.AuditLogPath); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	return []string{
		"--audit-policy-file=" + policyPath,
		"--audit-log-path=" + c.AuditLogPath,
		"--audit-log-format=json",
		"--audit-log-maxsize=0", // one file, never rotated: the check reads it whole
	}, nil
}
