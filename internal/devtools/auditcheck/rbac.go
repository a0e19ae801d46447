// Package auditcheck holds shipped RBAC against what the components were
// seen to do: it reads the RBAC of package/manifests (ServiceAccounts,
// Roles, ClusterRoles and their bindings) and the API server's audit log
// (JSON lines, level Metadata), and reports every request a component was
// denied, every verb a role grants that its component never used, and
// every wildcard grant. The end-to-end suite runs it over its own audit log
// (test/e2e/audit_test.go); docs/security.md "Least privilege".
package auditcheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// RBAC is the RBAC objects of a set of manifests.
type RBAC struct {
	ServiceAccounts     []string               // namespace/name
	Roles               map[string]rbacv1.Role // by namespace/name
	ClusterRoles        map[string]rbacv1.ClusterRole
	RoleBindings        []rbacv1.RoleBinding
	ClusterRoleBindings []rbacv1.ClusterRoleBinding
}

// LoadManifests reads every .yaml/.yml/.json file under the given files
// and directories (recursively) and keeps the RBAC objects.
func LoadManifests(paths ...string) (*RBAC, error) {
	r := &RBAC{Roles: map[string]rbacv1.Role{}, ClusterRoles: map[string]rbacv1.ClusterRole{}}
	for _, root := range paths {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			switch strings.ToLower(filepath.Ext(path)) {
			case ".yaml", ".yml", ".json":
			default:
				return nil
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := r.add(f); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}

// ParseManifests is LoadManifests of one multi-document YAML stream.
func ParseManifests(in io.Reader) (*RBAC, error) {
	r := &RBAC{Roles: map[string]rbacv1.Role{}, ClusterRoles: map[string]rbacv1.ClusterRole{}}
	return r, r.add(in)
}

func (r *RBAC) add(in io.Reader) error {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(in))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return err
		}
		if tm.Kind == "" { // comments only
			continue
		}
		switch tm.Kind {
		case "ServiceAccount":
			var o corev1.ServiceAccount
			if err := yaml.UnmarshalStrict(doc, &o); err != nil {
				return fmt.Errorf("ServiceAccount: %w", err)
			}
			r.ServiceAccounts = append(r.ServiceAccounts, o.Namespace+"/"+o.Name)
		case "Role":
			var o rbacv1.Role
			if err := yaml.UnmarshalStrict(doc, &o); err != nil {
				return fmt.Errorf("Role: %w", err)
			}
			r.Roles[o.Namespace+"/"+o.Name] = o
		case "ClusterRole":
			var o rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict(doc, &o); err != nil {
				return fmt.Errorf("ClusterRole: %w", err)
			}
			r.ClusterRoles[o.Name] = o
		case "RoleBinding":
			var o rbacv1.RoleBinding
			if err := yaml.UnmarshalStrict(doc, &o); err != nil {
				return fmt.Errorf("RoleBinding: %w", err)
			}
			r.RoleBindings = append(r.RoleBindings, o)
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			if err := yaml.UnmarshalStrict(doc, &o); err != nil {
				return fmt.Errorf("ClusterRoleBinding: %w", err)
			}
			r.ClusterRoleBindings = append(r.ClusterRoleBindings, o)
		}
	}
}

// Grant is one verb on one resource that a rule gives, where the binding
// gives it. A rule of two verbs on three resources is six Grants.
type Grant struct {
	// Role says where the rule is: "ClusterRole x" or "Role ns/x".
	Role string
	// Namespace is the RoleBinding's namespace; "" for a ClusterRoleBinding
	// (every namespace and the cluster-scoped resources).
	Namespace string
	// Group, Resource (with "/subresource" if any) and Verb may be "*".
	Group, Resource, Verb string
	ResourceNames         []string
	NonResourceURL        string // for a nonResourceURLs rule, instead of Group and Resource
}

func (g Grant) String() string {
	what := g.Resource
	if g.Group != "" {
		what += "." + g.Group
	}
	if g.NonResourceURL != "" {
		what = g.NonResourceURL
	}
	if len(g.ResourceNames) > 0 {
		what += " " + strings.Join(g.ResourceNames, ",")
	}
	where := "cluster-wide"
	if g.Namespace != "" {
		where = "in " + g.Namespace
	}
	return fmt.Sprintf("%s %s %s (%s)", g.Verb, what, where, g.Role)
}

// Wildcard is true when the grant names no single group, resource or verb.
func (g Grant) Wildcard() bool {
	return g.Group == "*" || g.Verb == "*" || g.NonResourceURL == "*" ||
		g.Resource == "*" || strings.HasPrefix(g.Resource, "*/") || strings.HasSuffix(g.Resource, "/*")
}

// ServiceAccountUser is the user name the API server gives a ServiceAccount.
func ServiceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// GrantsOf lists what the manifests' bindings give the ServiceAccount
// namespace/name by name; the groups every ServiceAccount is in
// (system:serviceaccounts, system:serviceaccounts:<namespace>,
// system:authenticated) are left out: what they give is everyone's, not
// the component's to use or lose.
func (r *RBAC) GrantsOf(namespace, name string) ([]Grant, error) {
	isSubject := func(subjects []rbacv1.Subject, bindingNS string) bool {
		for _, s := range subjects {
			ns := s.Namespace
			if ns == "" {
				ns = bindingNS
			}
			if s.Kind == rbacv1.ServiceAccountKind && s.Name == name && ns == namespace {
				return true
			}
		}
		return false
	}
	var out []Grant
	for _, b := range r.ClusterRoleBindings {
		if !isSubject(b.Subjects, "") {
			continue
		}
		if b.RoleRef.Kind != "ClusterRole" {
			return nil, fmt.Errorf("ClusterRoleBinding %s refers to a %s", b.Name, b.RoleRef.Kind)
		}
		role, ok := r.ClusterRoles[b.RoleRef.Name]
		if !ok {
			return nil, fmt.Errorf("ClusterRoleBinding %s: no ClusterRole %s in the manifests", b.Name, b.RoleRef.Name)
		}
		out = append(out, expand("ClusterRole "+role.Name, "", role.Rules)...)
	}
	for _, b := range r.RoleBindings {
		if !isSubject(b.Subjects, b.Namespace) {
			continue
		}
		switch b.RoleRef.Kind {
		case "ClusterRole":
			role, ok := r.ClusterRoles[b.RoleRef.Name]
			if !ok {
				return nil, fmt.Errorf("RoleBinding %s/%s: no ClusterRole %s in the manifests", b.Namespace, b.Name, b.RoleRef.Name)
			}
			out = append(out, expand("ClusterRole "+role.Name, b.Namespace, role.Rules)...)
		case "Role":
			role, ok := r.Roles[b.Namespace+"/"+b.RoleRef.Name]
			if !ok {
				role, ok = bootstrapRoles[b.Namespace+"/"+b.RoleRef.Name]
			}
			if !ok {
				return nil, fmt.Errorf("RoleBinding %s/%s: no Role %s in the manifests", b.Namespace, b.Name, b.RoleRef.Name)
			}
			out = append(out, expand("Role "+b.Namespace+"/"+role.Name, b.Namespace, role.Rules)...)
		default:
			return nil, fmt.Errorf("RoleBinding %s/%s refers to a %s", b.Namespace, b.Name, b.RoleRef.Kind)
		}
	}
	return out, nil
}

// bootstrapRoles are the Roles of Kubernetes' bootstrap policy that the
// manifests bind to, as the API server creates them.
var bootstrapRoles = map[string]rbacv1.Role{
	"kube-system/extension-apiserver-authentication-reader": {
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "extension-apiserver-authentication-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{"extension-apiserver-authentication"}, Verbs: []string{"get", "list", "watch"}}},
	},
}

func expand(role, namespace string, rules []rbacv1.PolicyRule) []Grant {
	var out []Grant
	for _, rule := range rules {
		for _, verb := range rule.Verbs {
			for _, url := range rule.NonResourceURLs {
				out = append(out, Grant{Role: role, Namespace: namespace, Verb: verb, NonResourceURL: url})
			}
			for _, group := range rule.APIGroups {
				for _, res := range rule.Resources {
					out = append(out, Grant{Role: role, Namespace: namespace, Group: group, Resource: res, Verb: verb,
						ResourceNames: slices.Clone(rule.ResourceNames)})
				}
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Covers says whether the grant allows the request, as the RBAC
// authorizer decides it.
func (g Grant) Covers(r Request) bool {
	if !matches(g.Verb, r.Verb) {
		return false
	}
	if r.NonResourceURL != "" || g.NonResourceURL != "" {
		if r.NonResourceURL == "" || g.NonResourceURL == "" {
			return false
		}
		return g.NonResourceURL == "*" || g.NonResourceURL == r.NonResourceURL ||
			(strings.HasSuffix(g.NonResourceURL, "*") && strings.HasPrefix(r.NonResourceURL, strings.TrimSuffix(g.NonResourceURL, "*")))
	}
	if !matches(g.Group, r.Group) {
		return false
	}
	res := r.Resource
	if r.Subresource != "" {
		res += "/" + r.Subresource
	}
	switch {
	case g.Resource == "*" || g.Resource == res:
	case r.Subresource != "" && g.Resource == "*/"+r.Subresource:
	case r.Subresource != "" && g.Resource == r.Resource+"/*":
	default:
		return false
	}
	if g.Namespace != "" && g.Namespace != r.Namespace {
		return false
	}
	return len(g.ResourceNames) == 0 || (r.Name != "" && slices.Contains(g.ResourceNames, r.Name))
}

func matches(rule, value string) bool { return rule == "*" || rule == value }
