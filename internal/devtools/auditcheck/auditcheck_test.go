package auditcheck

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

const (
	manager = "system:serviceaccount:strata-system:strata-manager"
	csi     = "system:serviceaccount:strata-system:strata-csi-controller"
)

// event is one audit line as the API server writes it at level Metadata.
type event struct {
	id, stage, user, agent, verb, group, resource, sub, ns, name, uri string
	code                                                              int32
	decision, message                                                 string
}

func (e event) line(t *testing.T) string {
	t.Helper()
	ev := auditv1.Event{
		TypeMeta: metav1.TypeMeta{APIVersion: "audit.k8s.io/v1", Kind: "Event"},
		Level:    auditv1.LevelMetadata, AuditID: k8stypes.UID(e.id), Stage: auditv1.Stage(e.stage),
		RequestURI: e.uri, Verb: e.verb, User: authnv1.UserInfo{Username: e.user}, UserAgent: e.agent,
		ResponseStatus: &metav1.Status{Code: e.code, Message: e.message},
	}
	if ev.Stage == "" {
		ev.Stage = auditv1.StageResponseComplete
	}
	if ev.UserAgent == "" {
		ev.UserAgent = "strata-manager/v1 (linux/amd64) kubernetes/$Format"
	}
	if e.resource != "" {
		ev.ObjectRef = &auditv1.ObjectReference{APIGroup: e.group, Resource: e.resource, Subresource: e.sub,
			Namespace: e.ns, Name: e.name}
	}
	if e.decision != "" {
		ev.Annotations = map[string]string{decisionAnnotation: e.decision}
	}
	b, err := json.Marshal(ev)
	require.NoError(t, err)
	return string(b) + "\n"
}

func logOf(t *testing.T, events ...event) *Log {
	t.Helper()
	var b strings.Builder
	for i, e := range events {
		if e.id == "" {
			e.id = "id-" + string(rune('a'+i))
		}
		if e.code == 0 {
			e.code = 200
		}
		if e.decision == "" {
			e.decision = "allow"
		}
		b.WriteString(e.line(t))
	}
	l, err := ReadLog(strings.NewReader(b.String()))
	require.NoError(t, err)
	return l
}

const testManifests = `
# a comment-only document
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: strata-manager, namespace: strata-system}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: strata-csi-controller, namespace: strata-system}
automountServiceAccountToken: false
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: strata-manager}
rules:
  - apiGroups: ["strata.io"]
    resources: ["volumes", "volumes/status"]
    verbs: ["list", "update"]
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: strata-manager}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: strata-manager}
subjects: [{kind: ServiceAccount, name: strata-manager, namespace: strata-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: strata-manager, namespace: strata-system}
rules:
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: ["creds"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: strata-manager, namespace: strata-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: strata-manager}
subjects: [{kind: ServiceAccount, name: strata-manager}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules:
  - apiGroups: ["*"]
    resources: ["*"]
    verbs: ["get"]
---
# everyone may read: not the manager's to use
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: everyone, namespace: strata-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects: [{kind: Group, name: "system:authenticated", apiGroup: rbac.authorization.k8s.io}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: csi-reads, namespace: strata-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects: [{kind: ServiceAccount, name: strata-csi-controller, namespace: strata-system}]
`

func TestGrantsOf(t *testing.T) {
	r, err := ParseManifests(strings.NewReader(testManifests))
	require.NoError(t, err)
	assert.Equal(t, []string{"strata-system/strata-manager", "strata-system/strata-csi-controller"}, r.ServiceAccounts)

	grants, err := r.GrantsOf("strata-system", "strata-manager")
	require.NoError(t, err)
	var got []string
	for _, g := range grants {
		got = append(got, g.String())
	}
	assert.Equal(t, []string{
		"get nodes cluster-wide (ClusterRole strata-manager)",
		"list volumes.strata.io cluster-wide (ClusterRole strata-manager)",
		"list volumes/status.strata.io cluster-wide (ClusterRole strata-manager)",
		"update volumes.strata.io cluster-wide (ClusterRole strata-manager)",
		"update volumes/status.strata.io cluster-wide (ClusterRole strata-manager)",
		"get secrets creds in strata-system (Role strata-system/strata-manager)",
	}, got, "the group binding (system:authenticated) is not the manager's")

	csiGrants, err := r.GrantsOf("strata-system", "strata-csi-controller")
	require.NoError(t, err)
	require.Len(t, csiGrants, 1)
	assert.Equal(t, Grant{Role: "ClusterRole reader", Namespace: "strata-system", Group: "*", Resource: "*", Verb: "get",
		ResourceNames: nil}, csiGrants[0], "a ClusterRole bound in a namespace grants there only")
	assert.True(t, csiGrants[0].Wildcard())

	_, err = ParseManifests(strings.NewReader("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: x}\nrule: []\n"))
	assert.ErrorContains(t, err, "unknown field", "a misspelt field is an error, not an empty role")

	broken, err := ParseManifests(strings.NewReader(`apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: b, namespace: ns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: missing}
subjects: [{kind: ServiceAccount, name: sa}]
`))
	require.NoError(t, err)
	_, err = broken.GrantsOf("ns", "sa")
	assert.ErrorContains(t, err, "no Role missing")
}

func TestCovers(t *testing.T) {
	volumes := Request{Verb: "update", Group: "strata.io", Resource: "volumes", Namespace: "strata-system", Name: "v1"}
	status := volumes
	status.Subresource = "status"
	secret := Request{Verb: "get", Resource: "secrets", Namespace: "strata-system", Name: "creds"}
	create := Request{Verb: "create", Resource: "secrets", Namespace: "strata-system"}
	clusterList := Request{Verb: "list", Group: "strata.io", Resource: "volumes"}
	cases := []struct {
		name  string
		grant Grant
		req   Request
		want  bool
	}{
		{"exact", Grant{Verb: "update", Group: "strata.io", Resource: "volumes"}, volumes, true},
		{"another verb", Grant{Verb: "patch", Group: "strata.io", Resource: "volumes"}, volumes, false},
		{"another group", Grant{Verb: "update", Group: "", Resource: "volumes"}, volumes, false},
		{"the resource does not grant its status", Grant{Verb: "update", Group: "strata.io", Resource: "volumes"}, status, false},
		{"the status", Grant{Verb: "update", Group: "strata.io", Resource: "volumes/status"}, status, true},
		{"*/status", Grant{Verb: "update", Group: "strata.io", Resource: "*/status"}, status, true},
		{"volumes/*", Grant{Verb: "update", Group: "strata.io", Resource: "volumes/*"}, status, true},
		{"wildcards", Grant{Verb: "*", Group: "*", Resource: "*"}, status, true},
		{"a Role's namespace", Grant{Namespace: "strata-system", Verb: "update", Group: "strata.io", Resource: "volumes"}, volumes, true},
		{"another namespace", Grant{Namespace: "default", Verb: "update", Group: "strata.io", Resource: "volumes"}, volumes, false},
		{"a Role does not list across namespaces", Grant{Namespace: "strata-system", Verb: "list", Group: "strata.io",
			Resource: "volumes"}, clusterList, false},
		{"a ClusterRoleBinding does", Grant{Verb: "list", Group: "strata.io", Resource: "volumes"}, clusterList, true},
		{"by name", Grant{Verb: "get", Resource: "secrets", ResourceNames: []string{"creds"}}, secret, true},
		{"another name", Grant{Verb: "get", Resource: "secrets", ResourceNames: []string{"other"}}, secret, false},
		{"create is never limited by name", Grant{Verb: "create", Resource: "secrets", ResourceNames: []string{"creds"}}, create, false},
		{"a non-resource URL", Grant{Verb: "get", NonResourceURL: "/metrics"}, Request{Verb: "get", NonResourceURL: "/metrics"}, true},
		{"a non-resource prefix", Grant{Verb: "get", NonResourceURL: "/apis/*"}, Request{Verb: "get", NonResourceURL: "/apis/x"}, true},
		{"a resource rule is no URL rule", Grant{Verb: "get", Group: "*", Resource: "*"}, Request{Verb: "get", NonResourceURL: "/api"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.grant.Covers(tc.req))
		})
	}
}

func TestReadLog(t *testing.T) {
	watch := event{id: "w", stage: "ResponseStarted", user: manager, verb: "watch", group: "strata.io", resource: "volumes",
		ns: "strata-system", code: 200, decision: "allow"}
	watchEnd := watch
	watchEnd.stage = "ResponseComplete"
	denied := event{id: "d", user: manager, verb: "get", resource: "secrets", ns: "strata-system", name: "x", code: 403,
		decision: "forbid"}
	admission := event{id: "q", user: csi, verb: "create", group: "strata.io", resource: "volumes", ns: "strata-system",
		code: 403, decision: "allow"}
	discovery := event{id: "u", user: manager, verb: "get", uri: "/apis/strata.io/v1beta1?timeout=32s", code: 200, decision: "allow"}
	applyCreate := event{id: "c", user: manager, verb: "patch", group: "", resource: "configmaps", ns: "strata-system", name: "cm",
		code: 403, decision: "allow", message: `configmaps "cm" is forbidden: User "` + manager +
			`" cannot create resource "configmaps" in API group "" in the namespace "strata-system"`}
	in := watch.line(t) + watchEnd.line(t) + denied.line(t) + admission.line(t) + discovery.line(t) + applyCreate.line(t)

	l, err := ReadLog(strings.NewReader(in + `{"auditID":"cut`))
	require.NoError(t, err, "a last line cut short is skipped")
	assert.Equal(t, 6, l.Events)
	agent := "strata-manager/v1 (linux/amd64) kubernetes/$Format"
	assert.Equal(t, map[Request]int{
		{User: manager, UserAgent: agent, Verb: "watch", Group: "strata.io", Resource: "volumes", Namespace: "strata-system",
			Code: 200}: 1, // once, though logged at two stages
		{User: manager, UserAgent: agent, Verb: "get", Resource: "secrets", Namespace: "strata-system", Name: "x", Code: 403,
			Denied: true}: 1,
		{User: csi, UserAgent: agent, Verb: "create", Group: "strata.io", Resource: "volumes", Namespace: "strata-system",
			Code: 403}: 1, // a webhook's or quota's refusal: RBAC allowed it
		{User: manager, UserAgent: agent, Verb: "get", NonResourceURL: "/apis/strata.io/v1beta1", Code: 200}: 1,
		// allowed as a patch, refused the create it would have been
		{User: manager, UserAgent: agent, Verb: "create", Resource: "configmaps", Namespace: "strata-system", Code: 403,
			Denied: true}: 1,
	}, l.Requests)

	_, err = ReadLog(strings.NewReader(`{"auditID":` + "\n" + in))
	assert.ErrorContains(t, err, "line 1", "a broken line before the end is an error")
}

func TestCheck(t *testing.T) {
	rbac, err := ParseManifests(strings.NewReader(testManifests))
	require.NoError(t, err)
	components := []Component{{Name: "manager", Namespace: "strata-system", ServiceAccount: "strata-manager"}}
	// Every grant of the manager used once.
	all := []event{
		{user: manager, verb: "list", group: "strata.io", resource: "volumes", ns: "strata-system"},
		{user: manager, verb: "list", group: "strata.io", resource: "volumes", sub: "status"},
		{user: manager, verb: "update", group: "strata.io", resource: "volumes", ns: "strata-system", name: "v"},
		{user: manager, verb: "update", group: "strata.io", resource: "volumes", sub: "status", ns: "strata-system", name: "v"},
		{user: manager, verb: "get", resource: "nodes", name: "n1"},
		{user: manager, verb: "get", resource: "secrets", ns: "strata-system", name: "creds"},
	}
	without := func(i int) []event { return append(append([]event{}, all[:i]...), all[i+1:]...) }
	deniedGet := event{user: manager, verb: "get", resource: "secrets", ns: "strata-system", name: "other", code: 403, decision: "forbid"}
	probe := deniedGet
	probe.agent = "e2e.test/v0.0.0"

	cases := []struct {
		name         string
		events       []event
		cfg          Config
		wantFailures []string
		wantNotes    []string
	}{
		{name: "every grant used", events: all},
		{name: "a grant unused", events: without(4),
			wantFailures: []string{"manager: granted but unused: get nodes cluster-wide (ClusterRole strata-manager)"}},
		{name: "a grant unused in part of the flows says nothing", events: without(4), cfg: Config{PartialRun: true}},
		{name: "a denial in part of the flows is one", events: append(without(4), deniedGet), cfg: Config{PartialRun: true},
			wantFailures: []string{`manager: denied 1 time(s): get secrets (strata-system), name "other", by strata-manager/v1 (linux/amd64) kubernetes/$Format`}},
		{name: "an unused grant excused", events: without(4),
			cfg: Config{Unused: []Allowance{{Component: "manager", Verb: "get", Resource: "nodes", Reason: "rare"}}}},
		{name: "an excuse not needed is a note", events: all,
			cfg:       Config{Unused: []Allowance{{Component: "manager", Verb: "get", Resource: "nodes", Reason: "rare"}}},
			wantNotes: []string{"allowance (unused) manager: get nodes: not needed this run"}},
		{name: "an excuse for what is not granted fails", events: all,
			cfg:          Config{Unused: []Allowance{{Component: "manager", Verb: "delete", Resource: "nodes", Reason: "gone"}}},
			wantFailures: []string{"allowance (unused) manager: delete nodes: the manifests grant no such thing; remove it"}},
		{name: "a denial", events: append(all, deniedGet),
			wantFailures: []string{`manager: denied 1 time(s): get secrets (strata-system), name "other", by strata-manager/v1 (linux/amd64) kubernetes/$Format`}},
		{name: "a denial caused on purpose", events: append(all, deniedGet),
			cfg: Config{Denied: []Allowance{{Component: "manager", Verb: "get", Resource: "secrets", Name: "other", Reason: "test"}}}},
		{name: "an excused denial of another name is still one", events: append(all, deniedGet),
			cfg:          Config{Denied: []Allowance{{Component: "manager", Verb: "get", Resource: "secrets", Name: "third", Reason: "test"}}},
			wantFailures: []string{`manager: denied 1 time(s): get secrets (strata-system), name "other", by strata-manager/v1 (linux/amd64) kubernetes/$Format`},
			wantNotes:    []string{"allowance (denied) manager: get secrets third: not needed this run"}},
		{name: "a test borrowing the token is not the component", events: append(all, probe),
			cfg: Config{IgnoreUserAgents: []string{"e2e.test/"}}},
		{name: "an access granted elsewhere is a note", events: append(all,
			event{user: manager, verb: "create", group: "authorization.k8s.io", resource: "selfsubjectaccessreviews"}),
			wantNotes: []string{"manager: allowed by no rule of the manifests (a default role?): create selfsubjectaccessreviews.authorization.k8s.io (cluster), 1 time(s)"}},
		{name: "other users are not counted", events: append(all, event{user: "system:serviceaccount:x:y", verb: "get",
			resource: "secrets", ns: "x", code: 403, decision: "forbid"})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Components = components
			rep, err := Check(rbac, logOf(t, tc.events...), cfg)
			require.NoError(t, err)
			assert.Equal(t, tc.wantFailures, rep.Failures)
			assert.Equal(t, tc.wantNotes, rep.Notes)
			assert.Equal(t, len(tc.wantFailures) > 0, rep.Failed())
		})
	}

	t.Run("a watch uses list, a patch that created uses create", func(t *testing.T) {
		r, err := ParseManifests(strings.NewReader(`
apiVersion: v1
kind: ServiceAccount
metadata: {name: strata-manager, namespace: strata-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: m, namespace: strata-system}
rules:
  - {apiGroups: [""], resources: ["configmaps"], verbs: ["list", "watch", "create"]}
  - {apiGroups: [""], resources: ["configmaps"], resourceNames: ["cm"], verbs: ["patch"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: m, namespace: strata-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: m}
subjects: [{kind: ServiceAccount, name: strata-manager}]
`))
		require.NoError(t, err)
		watchAndApply := []event{
			{user: manager, verb: "watch", resource: "configmaps", ns: "strata-system"},
			{user: manager, verb: "patch", resource: "configmaps", ns: "strata-system", name: "cm", code: 201},
		}
		rep, err := Check(r, logOf(t, watchAndApply...), Config{Components: components})
		require.NoError(t, err)
		assert.Empty(t, rep.Failures)
		watchAndApply[1].code = 200 // the object was there: a plain patch
		rep, err = Check(r, logOf(t, watchAndApply...), Config{Components: components})
		require.NoError(t, err)
		assert.Equal(t, []string{"manager: granted but unused: create configmaps in strata-system (Role strata-system/m)"}, rep.Failures)
	})

	t.Run("wildcards are too broad unless excused", func(t *testing.T) {
		csiComponent := []Component{{Name: "csi", Namespace: "strata-system", ServiceAccount: "strata-csi-controller"}}
		used := logOf(t, event{user: csi, verb: "get", group: "strata.io", resource: "volumes", ns: "strata-system", name: "v"})
		rep, err := Check(rbac, used, Config{Components: csiComponent})
		require.NoError(t, err)
		assert.Equal(t, []string{"csi: too broad: ClusterRole reader grants get *.* in strata-system (ClusterRole reader); name the resources and verbs"},
			rep.Failures)
		rep, err = Check(rbac, used, Config{Components: csiComponent,
			Broad: []Allowance{{Component: "csi", Verb: "get", Group: "*", Resource: "*", Reason: "a reader"}}})
		require.NoError(t, err)
		assert.Empty(t, rep.Failures)
		c := rep.Components[0]
		assert.Equal(t, 1, c.Requests)
		assert.Equal(t, 1, c.UsedResourceVerbs())
		assert.Equal(t, 1, c.GrantedResourceVerbs())
	})

	t.Run("the figures", func(t *testing.T) {
		rep, err := Check(rbac, logOf(t, append(without(4), probe)...), Config{Components: components,
			IgnoreUserAgents: []string{"e2e.test/"}, Unused: []Allowance{{Component: "manager", Verb: "get", Resource: "nodes", Reason: "rare"}}})
		require.NoError(t, err)
		c := rep.Components[0]
		assert.Equal(t, 5, c.Requests)
		assert.Equal(t, 1, c.Ignored)
		assert.Equal(t, 5, c.UsedResourceVerbs(), "list and update of volumes and volumes/status; get secrets")
		assert.Equal(t, 6, c.GrantedResourceVerbs())
		assert.Equal(t, 1, c.UnusedExcused)
		assert.Equal(t, map[string]int{"strata-manager": 5}, c.UserAgents)
		assert.Contains(t, rep.Summary(), "manager                   5 requests (1 by ignored clients),  5 of  6 granted (resource, verb) used")
		assert.Contains(t, rep.Details(), "unused       get nodes cluster-wide (ClusterRole strata-manager)")
	})

	t.Run("a component whose ServiceAccount is not in the manifests", func(t *testing.T) {
		_, err := Check(rbac, logOf(t), Config{Components: []Component{{Name: "x", Namespace: "strata-system", ServiceAccount: "x"}}})
		assert.ErrorContains(t, err, "ServiceAccount strata-system/x is not in the manifests")
	})
}
