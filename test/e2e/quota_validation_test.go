package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
)

// The quota tests each work in a namespace of their own, quota-*, deleted
// when the test ends: quotas live in users' namespaces, one per namespace.

// quotaNamespace creates a fresh namespace for one test.
func quotaNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns, err := env.adminKube.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "quota-"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.adminKube.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// newQuota is a valid default-resource-quota: 10Gi for the namespace, 5Gi
// for VM vm-1.
func newQuota(ns string) *v1beta1.ResourceQuota {
	nsQuota := resource.MustParse("10Gi")
	return &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: ns},
		Spec: v1beta1.ResourceQuotaSpec{SnapshotLimit: v1beta1.SnapshotLimit{
			NamespaceTotalSnapshotSizeQuota: &nsQuota,
			VMTotalSnapshotSizeQuota:        map[string]resource.Quantity{"vm-1": resource.MustParse("5Gi")},
		}}}
}

// Seed snapshot-space-management, test plan 1: a quota that does not parse,
// a negative one, a key that cannot name a VM and another object name are
// each refused with a message naming the field, whether sent by a Go client,
// as raw JSON or with kubectl; valid quotas are accepted. A value that does
// not parse never reaches the webhook: the CRD schema's pattern refuses it.
func TestQuotaValidation(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	ctx := context.Background()
	ns := quotaNamespace(t)
	quotas := env.adminStrata.StrataV1beta1().ResourceQuotas(ns)
	const webhookDenied = `admission webhook "validator.strata.io" denied the request: `
	const notAQuantity = `not a quantity such as 10Gi`

	// create sends the object as raw JSON, so that values no Go client could
	// hold ("abc") reach the API server; a quota it accepts is deleted again.
	create := func(body string) error {
		err := env.adminStrata.StrataV1beta1().RESTClient().Post().Namespace(ns).Resource("resourcequotas").
			Body([]byte(body)).Do(ctx).Error()
		if err == nil {
			require.NoError(t, quotas.Delete(ctx, v1beta1.DefaultResourceQuotaName, metav1.DeleteOptions{}))
		}
		return err
	}
	quotaJSON := func(name, limit string) string {
		return `{"apiVersion":"strata.io/v1beta1","kind":"ResourceQuota","metadata":{"name":"` + name + `"},` +
			`"spec":{"snapshotLimit":` + limit + `}}`
	}
	const name = v1beta1.DefaultResourceQuotaName

	t.Run("create", func(t *testing.T) {
		tests := []struct {
			name, body string
			// wantMsg are substrings of the rejection; none means accepted.
			wantMsg []string
		}{
			{"valid quotas", quotaJSON(name, `{"namespaceTotalSnapshotSizeQuota":"10Gi","vmTotalSnapshotSizeQuota":{"vm-1":"5Gi","web.db":1073741824}}`), nil},
			{"zero quotas", quotaJSON(name, `{"namespaceTotalSnapshotSizeQuota":"0","vmTotalSnapshotSizeQuota":{"vm-1":0}}`), nil},
			{"no limits", quotaJSON(name, `{}`), nil},
			{"namespace quota that does not parse", quotaJSON(name, `{"namespaceTotalSnapshotSizeQuota":"abc"}`),
				[]string{`spec.snapshotLimit.namespaceTotalSnapshotSizeQuota: Invalid value: "abc"`, notAQuantity}},
			{"VM quota that does not parse", quotaJSON(name, `{"vmTotalSnapshotSizeQuota":{"vm-1":"abc"}}`),
				[]string{`spec.snapshotLimit.vmTotalSnapshotSizeQuota[vm-1]: Invalid value: "abc"`, notAQuantity}},
			{"namespace quota of 10 gigabits", quotaJSON(name, `{"namespaceTotalSnapshotSizeQuota":"10Gb"}`),
				[]string{`spec.snapshotLimit.namespaceTotalSnapshotSizeQuota: Invalid value: "10Gb"`, notAQuantity}},
			{"negative namespace quota", quotaJSON(name, `{"namespaceTotalSnapshotSizeQuota":"-1Gi"}`),
				[]string{"spec.snapshotLimit.namespaceTotalSnapshotSizeQuota", "must not be negative"}},
			{"negative namespace quota as a number", quotaJSON(name, `{"namespaceTotalSnapshotSizeQuota":-1}`),
				[]string{"spec.snapshotLimit.namespaceTotalSnapshotSizeQuota", "must not be negative"}},
			{"negative VM quota", quotaJSON(name, `{"vmTotalSnapshotSizeQuota":{"vm-1":"-1Gi"}}`),
				[]string{webhookDenied + `spec.snapshotLimit.vmTotalSnapshotSizeQuota[vm-1]: must not be negative, got -1Gi`}},
			{"VM name in capitals", quotaJSON(name, `{"vmTotalSnapshotSizeQuota":{"My_VM":"1Gi"}}`),
				[]string{webhookDenied + `spec.snapshotLimit.vmTotalSnapshotSizeQuota[My_VM]: "My_VM" is not a VM name: a lowercase RFC 1123 subdomain`}},
			{"another name", quotaJSON("my-quota", `{"namespaceTotalSnapshotSizeQuota":"10Gi"}`),
				[]string{webhookDenied + `metadata.name: Strata reads only the ResourceQuota named default-resource-quota in each namespace; "my-quota" would have no effect`}},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				err := create(tc.body)
				if len(tc.wantMsg) == 0 {
					require.NoError(t, err)
					return
				}
				require.Error(t, err)
				assert.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
				for _, m := range tc.wantMsg {
					assert.Contains(t, err.Error(), m)
				}
			})
		}
		list, err := quotas.List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		assert.Empty(t, list.Items, "nothing refused was stored")
	})

	t.Run("update", func(t *testing.T) {
		_, err := quotas.Create(ctx, newQuota(ns), metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = quotas.Delete(ctx, v1beta1.DefaultResourceQuotaName, metav1.DeleteOptions{}) })
		patch := func(body string) error {
			_, err := quotas.Patch(ctx, v1beta1.DefaultResourceQuotaName, k8stypes.MergePatchType, []byte(body), metav1.PatchOptions{})
			return err
		}
		require.NoError(t, patch(`{"spec":{"snapshotLimit":{"namespaceTotalSnapshotSizeQuota":"20Gi","vmTotalSnapshotSizeQuota":{"vm-2":"1Gi"}}}}`))

		err = patch(`{"spec":{"snapshotLimit":{"vmTotalSnapshotSizeQuota":{"vm-2":"-1"}}}}`)
		require.Error(t, err)
		assert.Contains(t, err.Error(), webhookDenied+`spec.snapshotLimit.vmTotalSnapshotSizeQuota[vm-2]: must not be negative, got -1`)
		err = patch(`{"spec":{"snapshotLimit":{"vmTotalSnapshotSizeQuota":{"vm-2":"lots"}}}}`)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `spec.snapshotLimit.vmTotalSnapshotSizeQuota[vm-2]: Invalid value: "lots"`)
		err = patch(`{"spec":{"snapshotLimit":{"namespaceTotalSnapshotSizeQuota":"-20Gi"}}}`)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "spec.snapshotLimit.namespaceTotalSnapshotSizeQuota")
		assert.Contains(t, err.Error(), "must not be negative")

		got, err := quotas.Get(ctx, v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "20Gi", got.Spec.SnapshotLimit.NamespaceTotalSnapshotSizeQuota.String(), "the refused edits changed nothing")
		assert.Equal(t, map[string]resource.Quantity{"vm-1": resource.MustParse("5Gi"), "vm-2": resource.MustParse("1Gi")},
			got.Spec.SnapshotLimit.VMTotalSnapshotSizeQuota)

		// The usage the managers report goes through the status subresource,
		// which the webhook never judges.
		usage := resource.MustParse("1Gi")
		got.Status.SnapshotLimitStatus.NamespaceTotalSnapshotSizeUsage = &usage
		_, err = quotas.UpdateStatus(ctx, got, metav1.UpdateOptions{})
		assert.NoError(t, err)
	})

	// kubectl shows the webhook's denial as it shows the schema's: the
	// object is invalid, and each field with its reason.
	t.Run("kubectl", func(t *testing.T) {
		manifest := func(nsQuota, vm, vmQuota string) string {
			return "apiVersion: strata.io/v1beta1\nkind: ResourceQuota\nmetadata:\n  name: default-resource-quota\n  namespace: " + ns +
				"\nspec:\n  snapshotLimit:\n    namespaceTotalSnapshotSizeQuota: " + nsQuota +
				"\n    vmTotalSnapshotSizeQuota:\n      " + vm + ": " + vmQuota + "\n"
		}
		tests := []struct {
			name     string
			manifest string
			wantMsg  string
		}{
			{"namespace quota abc", manifest("abc", "vm-1", "1Gi"),
				`The ResourceQuota "default-resource-quota" is invalid: spec.snapshotLimit.namespaceTotalSnapshotSizeQuota: Invalid value: "abc"`},
			{"VM quota abc", manifest("10Gi", "vm-1", "abc"),
				`The ResourceQuota "default-resource-quota" is invalid: spec.snapshotLimit.vmTotalSnapshotSizeQuota[vm-1]: Invalid value: "abc"`},
			{"namespace quota -1Gi", manifest("-1Gi", "vm-1", "1Gi"),
				`The ResourceQuota "default-resource-quota" is invalid: spec.snapshotLimit.namespaceTotalSnapshotSizeQuota: Invalid value: "-1Gi": must not be negative`},
			{"VM quota -1Gi", manifest("10Gi", "vm-1", "-1Gi"),
				`The ResourceQuota "default-resource-quota" is invalid: spec.snapshotLimit.vmTotalSnapshotSizeQuota[vm-1]: must not be negative, got -1Gi`},
			{"VM name with a slash", manifest("10Gi", "team/vm", "1Gi"),
				`The ResourceQuota "default-resource-quota" is invalid: spec.snapshotLimit.vmTotalSnapshotSizeQuota[team/vm]: "team/vm" is not a VM name`},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				out, err := kubectlIn(t, tc.manifest, "apply", "-f", "-")
				require.Error(t, err, "kubectl apply is refused: %s", out)
				t.Log(strings.TrimSpace(out))
				assert.Contains(t, out, tc.wantMsg)
			})
		}
		out, err := kubectlIn(t, manifest("10Gi", "vm-1", "1Gi"), "apply", "-f", "-")
		require.NoError(t, err, out)
		assert.Contains(t, out, "resourcequota.strata.io/default-resource-quota created")
		out = kubectl(t, "-n", ns, "get", "srq", v1beta1.DefaultResourceQuotaName, "-o", "jsonpath={.spec.snapshotLimit}")
		assert.JSONEq(t, `{"namespaceTotalSnapshotSizeQuota":"10Gi","vmTotalSnapshotSizeQuota":{"vm-1":"1Gi"}}`, out)
	})
}

// Seed snapshot-space-management, test plans 6 and 7, on the real API
// server with impersonated users bound in one namespace: the quota roles
// package/manifests ships, and the built-in roles they are aggregated into.
func TestQuotaRBAC(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	ctx := context.Background()
	ns := quotaNamespace(t)
	_, err := env.adminStrata.StrataV1beta1().ResourceQuotas(ns).Create(ctx, newQuota(ns), metav1.CreateOptions{})
	require.NoError(t, err)

	// user -> the ClusterRole bound to them in ns.
	roles := map[string]string{
		"quota-viewer": "strata-resourcequota-view",
		"quota-admin":  "strata-resourcequota-admin",
		"ns-viewer":    "view",
		"ns-editor":    "edit",
		"ns-admin":     "admin",
	}
	for user, role := range roles {
		_, err := env.adminKube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	as := func(user string) versioned.Interface {
		cfg := rest.CopyConfig(env.cluster.AdminConfig)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		return versioned.NewForConfigOrDie(cfg)
	}
	// Every user may read the quota. The authorizer sees a new binding, and
	// the aggregation controller fills the built-in roles, a moment later:
	// wait for the read before judging the writes, so a refusal below is
	// the role's and not a binding not yet seen.
	for user := range roles {
		quotas := as(user).StrataV1beta1().ResourceQuotas(ns)
		require.Eventually(t, func() bool {
			_, err := quotas.Get(ctx, v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
			return err == nil
		}, 30*time.Second, 200*time.Millisecond, "%s (bound to %s) gets the quota", user, roles[user])
		list, err := quotas.List(ctx, metav1.ListOptions{})
		require.NoError(t, err, "%s lists quotas", user)
		assert.Len(t, list.Items, 1)
		w, err := quotas.Watch(ctx, metav1.ListOptions{})
		require.NoError(t, err, "%s watches quotas", user)
		w.Stop()
	}

	// The seed's two requests: the namespace quota and a VM's quota.
	setNamespaceQuota := func(user, q string) error {
		quotas := as(user).StrataV1beta1().ResourceQuotas(ns)
		rq, err := quotas.Get(ctx, v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		v := resource.MustParse(q)
		rq.Spec.SnapshotLimit.NamespaceTotalSnapshotSizeQuota = &v
		_, err = quotas.Update(ctx, rq, metav1.UpdateOptions{})
		return err
	}
	setVMQuota := func(user, q string) error {
		_, err := as(user).StrataV1beta1().ResourceQuotas(ns).Patch(ctx, v1beta1.DefaultResourceQuotaName, k8stypes.MergePatchType,
			[]byte(`{"spec":{"snapshotLimit":{"vmTotalSnapshotSizeQuota":{"vm-1":"`+q+`"}}}}`), metav1.PatchOptions{})
		return err
	}
	tests := []struct {
		user    string
		mayEdit bool
	}{
		{"quota-viewer", false},
		{"ns-viewer", false},
		// A namespace's users may not raise the quota meant to limit them.
		{"ns-editor", false},
		{"quota-admin", true},
		{"ns-admin", true},
	}
	for _, tc := range tests {
		t.Run(tc.user, func(t *testing.T) {
			for what, err := range map[string]error{
				"update the namespace quota": setNamespaceQuota(tc.user, "30Gi"),
				"patch a VM quota":           setVMQuota(tc.user, "7Gi"),
			} {
				if tc.mayEdit {
					assert.NoError(t, err, what)
				} else {
					assert.True(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", what, err)
				}
			}
			quotas := as(tc.user).StrataV1beta1().ResourceQuotas(ns)
			err := quotas.Delete(ctx, "no-such-quota", metav1.DeleteOptions{})
			if tc.mayEdit {
				assert.True(t, apierrors.IsNotFound(err), "delete: want NotFound, got %v", err)
			} else {
				assert.True(t, apierrors.IsForbidden(err), "delete: want Forbidden, got %v", err)
			}
		})
	}

	// What a viewer sees at the command line.
	out, err := tryKubectl(t, "--as", "quota-viewer", "-n", ns, "patch", "srq", v1beta1.DefaultResourceQuotaName,
		"--type", "merge", "-p", `{"spec":{"snapshotLimit":{"namespaceTotalSnapshotSizeQuota":"1Ti"}}}`)
	require.Error(t, err)
	assert.Contains(t, out, `Error from server (Forbidden): resourcequotas.strata.io "default-resource-quota" is forbidden: `+
		`User "quota-viewer" cannot patch resource "resourcequotas" in API group "strata.io" in the namespace "`+ns+`"`)
	assert.True(t, strings.HasPrefix(kubectl(t, "--as", "quota-viewer", "-n", ns, "get", "srq", "-o", "name"),
		"resourcequota.strata.io/default-resource-quota"))
}
