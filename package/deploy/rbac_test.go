package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// leaderElectionGrant is what the chart adds to package/manifests' RBAC
// with csiController.leaderElection on (its default): the sidecars' Lease.
// The manifests grant none (the process mode runs them without election).
var leaderElectionGrant = map[string][]string{
	"Role strata-system/strata-csi-controller": {
		"coordination.k8s.io/leases: create", "coordination.k8s.io/leases: get", "coordination.k8s.io/leases: update"},
}

// rbacKinds are the kinds whose content TestChartRBACMatchesManifests compares.
var rbacKinds = []string{"ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"}

// rbacSummary is every RBAC object of objs as lines a diff reads well:
// a role's grants one per (group, resource, name, verb) — so rules split or
// merged differently still compare equal — its aggregation labels, a
// binding's roleRef and subjects, a ServiceAccount's token automount.
func rbacSummary(t *testing.T, objs []object) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, o := range objs {
		if !slices.Contains(rbacKinds, o.Kind) {
			continue
		}
		var lines []string
		switch o.Kind {
		case "ServiceAccount":
			var sa corev1.ServiceAccount
			o.decode(t, &sa)
			lines = append(lines, fmt.Sprintf("automountServiceAccountToken: %v", deref(sa.AutomountServiceAccountToken)))
		case "ClusterRole", "Role":
			var r rbacv1.ClusterRole // a Role's fields are a subset
			o.decode(t, &r)
			lines = grants(r.Rules)
			for k, v := range r.Labels {
				if strings.HasPrefix(k, "rbac.authorization.k8s.io/") {
					lines = append(lines, "label "+k+"="+v)
				}
			}
			if r.AggregationRule != nil {
				lines = append(lines, fmt.Sprintf("aggregationRule %v", r.AggregationRule.ClusterRoleSelectors))
			}
		case "ClusterRoleBinding", "RoleBinding":
			var b rbacv1.RoleBinding
			o.decode(t, &b)
			lines = append(lines, fmt.Sprintf("roleRef %s %s", b.RoleRef.Kind, b.RoleRef.Name))
			for _, s := range b.Subjects {
				lines = append(lines, fmt.Sprintf("subject %s %s/%s", s.Kind, s.Namespace, s.Name))
			}
		}
		slices.Sort(lines)
		out[o.key()] = slices.Compact(lines)
	}
	return out
}

func grants(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, url := range r.NonResourceURLs {
			for _, v := range r.Verbs {
				out = append(out, "url "+url+": "+v)
			}
		}
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, n := range names {
					for _, v := range r.Verbs {
						what := g + "/" + res
						if n != "" {
							what += "[" + n + "]"
						}
						out = append(out, what+": "+v)
					}
				}
			}
		}
	}
	return out
}

func deref(b *bool) string {
	if b == nil {
		return "default"
	}
	return fmt.Sprint(*b)
}

// One truth for RBAC: the chart's ServiceAccounts, roles and bindings are
// package/manifests' (the ones the audit-checked e2e suite runs under),
// plus the sidecars' leader-election Lease.
func TestChartRBACMatchesManifests(t *testing.T) {
	want := rbacSummary(t, readObjects(t, filepath.Join(repoRoot(t), "package", "manifests", "*.yaml")))
	for key, extra := range leaderElectionGrant {
		require.Contains(t, want, key)
		want[key] = slices.Compact(slices.Sorted(slices.Values(append(want[key], extra...))))
	}
	got := rbacSummary(t, rendered(t))
	for key := range want {
		assert.Equal(t, want[key], got[key], "%s: the chart (package/deploy/strata.yaml) and package/manifests differ", key)
	}
	for key := range got {
		assert.Contains(t, want, key, "%s is in the chart, not in package/manifests", key)
	}
}

// The options that change RBAC: no leader election gives exactly the
// manifests' rules; a backup target's Secret (and extra ones) become
// readable by name, and only those.
func TestChartRBACOptions(t *testing.T) {
	helm := helmBinary(t)
	manifests := rbacSummary(t, readObjects(t, filepath.Join(repoRoot(t), "package", "manifests", "*.yaml")))
	noElection := rbacSummary(t, parseObjects(t, renderChart(t, helm, "csiController.leaderElection=false")))
	assert.Equal(t, manifests, noElection)

	objs := parseObjects(t, renderChart(t, helm, "backupTarget.url=s3://b@us-east-1/p",
		"backupTarget.credentialSecret=s3-keys", "extraBackupCredentialSecrets={other,s3-keys}"))
	role := rbacSummary(t, objs)["Role strata-system/strata-manager"]
	var secrets []string
	for _, g := range role {
		if strings.HasPrefix(g, "/secrets") {
			secrets = append(secrets, g)
		}
	}
	assert.Equal(t, []string{"/secrets[other]: get", "/secrets[s3-keys]: get", "/secrets[strata-backup-credentials]: get"}, secrets,
		"the managers read the backup credentials by name and no other Secret (the CA key is the CA signer's)")
	// One signer (issue 46): only the CA signer may approve and sign for
	// strata.io/identity or write the CA's Secret and bundle; the managers
	// only ask and read.
	for name, grants := range manifests {
		for _, g := range grants {
			if name == "ClusterRole /strata-signer" || name == "Role strata-system/strata-signer" {
				continue
			}
			assert.NotContains(t, g, "certificates.k8s.io/signers", name)
			assert.NotContains(t, g, "certificatesigningrequests/", name)
			assert.NotRegexp(t, `^/secrets(\[strata-webhook-ca\])?: `, g, name)
			assert.NotRegexp(t, `^/configmaps(\[strata-ca-bundle\])?: (create|update|patch)`, g, name)
		}
	}
	assert.Subset(t, manifests["ClusterRole /strata-signer"], []string{
		"certificates.k8s.io/signers[strata.io/identity]: approve", "certificates.k8s.io/signers[strata.io/identity]: sign"})
	assert.Subset(t, manifests["ClusterRole /strata-manager"], []string{
		"certificates.k8s.io/certificatesigningrequests: create", "certificates.k8s.io/certificatesigningrequests: watch"})
	// No impersonation at all, and no create of webhook configurations
	// (the chart ships them; issue 46).
	for name, grants := range manifests {
		for _, g := range grants {
			assert.NotContains(t, g, "impersonate", name)
			assert.NotRegexp(t, `^admissionregistration.k8s.io/\w+webhookconfigurations: create`, g, name)
		}
	}
	var objKeys []string
	for _, o := range objs {
		objKeys = append(objKeys, o.key())
	}
	for _, kind := range []string{"ValidatingWebhookConfiguration /strata-validator", "MutatingWebhookConfiguration /strata-mutator"} {
		assert.Contains(t, objKeys, kind, "the chart creates the webhook configurations the managers patch")
	}
	// Tokens only: no writes for certificate users, no reading of the
	// cluster's client CA.
	tokensOnly := parseObjects(t, renderChart(t, helm, "api.clientCertificates=false"))
	summary := rbacSummary(t, tokensOnly)
	assert.NotContains(t, summary, "RoleBinding kube-system/strata-manager-client-ca")
	assert.NotContains(t, summary["Role strata-system/strata-manager"], "strata.io/volumes: create")
	assert.NotContains(t, summary["ClusterRole /strata-manager"], "strata.io/resourcequotas: update")
	assert.Contains(t, manifests["Role strata-system/strata-manager"], "strata.io/volumes: create")
	_, given := flags(t, container(t, pods(t, tokensOnly)["strata-manager"], "manager"))
	assert.Equal(t, []string{""}, given["api-client-ca-configmap"])

	// Without the SnapshotMetadata sidecar: no container, no grants for
	// it or for its certificate and CR, no CA signer flag.
	noMetadata := parseObjects(t, renderChart(t, helm, "snapshotMetadata.enabled=false"))
	summary = rbacSummary(t, noMetadata)
	assert.NotContains(t, summary, "ClusterRole /strata-snapshot-metadata")
	for _, role := range []string{"Role strata-system/strata-signer", "ClusterRole /strata-signer", "ClusterRole /strata-manager",
		"Role strata-system/strata-manager"} {
		for _, what := range []string{"strata-snapshot-metadata-tls", "snapshotmetadataservices"} {
			assert.NotContains(t, strings.Join(summary[role], " "), what, role)
		}
	}
	assert.Contains(t, summary["Role strata-system/strata-signer"], "/secrets[strata-webhook-ca]: get")
	_, given = flags(t, container(t, pods(t, noMetadata)["strata-ca-signer"], "ca-signer"))
	assert.NotContains(t, given, "snapshot-metadata-address")
	for _, c := range pods(t, noMetadata)["strata-csi-controller"].Containers {
		assert.NotEqual(t, "csi-snapshot-metadata", c.Name)
	}
	defaults := pods(t, parseObjects(t, renderChart(t, helm)))
	_, given = flags(t, container(t, defaults["strata-ca-signer"], "ca-signer"))
	assert.Equal(t, []string{"strata-snapshot-metadata.strata-system:443"}, given["snapshot-metadata-address"],
		"by default backup tools dial the Service")
	_, given = flags(t, container(t, defaults["strata-manager"], "manager"))
	assert.NotContains(t, given, "snapshot-metadata-address", "the CA signer keeps the SnapshotMetadataService, not the managers")

	bt := find(t, objs, "BackupTarget", "default")
	assert.Contains(t, string(bt.json), `"credentialSecret":"s3-keys"`)
	assert.Contains(t, string(bt.json), `"backupTargetURL":"s3://b@us-east-1/p"`)
}

// helm uninstall's pre-delete hook (left out of strata.yaml, which kubectl
// applies): a Job running uninstall-check under an identity that may only
// list volumes, gone again once it succeeds, whose log (the refusal, naming
// the volumes) helm prints when it fails.
func TestChartUninstallCheckHook(t *testing.T) {
	objs := parseObjects(t, renderChartArgs(t, helmBinary(t), nil))
	shipped := map[string]bool{}
	for _, o := range rendered(t) {
		shipped[o.key()] = true
	}
	for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding", "Job"} {
		o := find(t, objs, kind, "strata-uninstall-check")
		assert.Equal(t, "pre-delete", o.Annotations["helm.sh/hook"], o.key())
		assert.Contains(t, o.Annotations["helm.sh/hook-delete-policy"], "hook-succeeded", o.key())
		assert.False(t, shipped[o.key()], "%s is a hook, not in strata.yaml", o.key())
	}
	assert.Equal(t, []string{"strata.io/volumes: list"},
		grants(rbacSummaryRules(t, find(t, objs, "Role", "strata-uninstall-check"))))
	var job batchv1.Job
	find(t, objs, "Job", "strata-uninstall-check").decode(t, &job)
	assert.Equal(t, "hook-failed", job.Annotations["helm.sh/hook-output-log-policy"],
		"helm prints the refusal, not only BackoffLimitExceeded")
	assert.Equal(t, int32(0), *job.Spec.BackoffLimit, "one failure fails the uninstall")
	assert.Equal(t, "uninstall-check", job.Spec.Template.Spec.Containers[0].Args[0])
	assert.Equal(t, "strata-uninstall-check", job.Spec.Template.Spec.ServiceAccountName)
}

func rbacSummaryRules(t *testing.T, o object) []rbacv1.PolicyRule {
	t.Helper()
	var r rbacv1.Role
	o.decode(t, &r)
	return r.Rules
}
