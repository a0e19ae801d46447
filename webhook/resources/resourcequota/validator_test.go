package resourcequota

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

// userNS is a user's namespace: quotas live there, not in strata-system.
const userNS = "team-a"

// quota is default-resource-quota in userNS with a 10Gi namespace quota and
// a 5Gi quota on VM vm-1; change edits it.
func quota(change func(*v1beta1.ResourceQuota)) *v1beta1.ResourceQuota {
	ns := resource.MustParse("10Gi")
	rq := &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: userNS},
		Spec: v1beta1.ResourceQuotaSpec{SnapshotLimit: v1beta1.SnapshotLimit{
			NamespaceTotalSnapshotSizeQuota: &ns,
			VMTotalSnapshotSizeQuota:        map[string]resource.Quantity{"vm-1": resource.MustParse("5Gi")},
		}}}
	if change != nil {
		change(rq)
	}
	return rq
}

func named(name string) func(*v1beta1.ResourceQuota) {
	return func(rq *v1beta1.ResourceQuota) { rq.Name = name }
}

func namespaceQuota(q string) func(*v1beta1.ResourceQuota) {
	return func(rq *v1beta1.ResourceQuota) {
		v := resource.MustParse(q)
		rq.Spec.SnapshotLimit.NamespaceTotalSnapshotSizeQuota = &v
	}
}

func vmQuota(vm, q string) func(*v1beta1.ResourceQuota) {
	return func(rq *v1beta1.ResourceQuota) {
		rq.Spec.SnapshotLimit.VMTotalSnapshotSizeQuota[vm] = resource.MustParse(q)
	}
}

func all(changes ...func(*v1beta1.ResourceQuota)) func(*v1beta1.ResourceQuota) {
	return func(rq *v1beta1.ResourceQuota) {
		for _, c := range changes {
			c(rq)
		}
	}
}

const vmKeyRule = `a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', ` +
	`and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is ` +
	`'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`

// Every case is judged on create and, as an edit of the valid quota, on
// update: the rules are the same.
func TestValidator(t *testing.T) {
	tests := []struct {
		name    string
		obj     *v1beta1.ResourceQuota
		wantMsg string
	}{
		{name: "namespace and VM quotas", obj: quota(nil)},
		{name: "no limits at all", obj: quota(func(rq *v1beta1.ResourceQuota) { rq.Spec = v1beta1.ResourceQuotaSpec{} })},
		{name: "zero quotas", obj: quota(all(namespaceQuota("0"), vmQuota("vm-1", "0")))},
		{name: "a plain byte count", obj: quota(namespaceQuota("1073741824"))},
		{name: "a VM name with dots", obj: quota(vmQuota("web.frontend-2", "1Gi"))},
		{name: "another name", obj: quota(named("my-quota")),
			wantMsg: `metadata.name: Strata reads only the ResourceQuota named default-resource-quota in each namespace; ` +
				`"my-quota" would have no effect`},
		{name: "a negative namespace quota", obj: quota(namespaceQuota("-1Gi")),
			wantMsg: `spec.snapshotLimit.namespaceTotalSnapshotSizeQuota: must not be negative, got -1Gi`},
		{name: "a negative VM quota", obj: quota(vmQuota("vm-2", "-500Mi")),
			wantMsg: `spec.snapshotLimit.vmTotalSnapshotSizeQuota[vm-2]: must not be negative, got -500Mi`},
		{name: "a VM name in capitals", obj: quota(vmQuota("Web_1", "1Gi")),
			wantMsg: `spec.snapshotLimit.vmTotalSnapshotSizeQuota[Web_1]: "Web_1" is not a VM name: ` + vmKeyRule},
		{name: "an empty VM name", obj: quota(vmQuota("", "1Gi")),
			wantMsg: `spec.snapshotLimit.vmTotalSnapshotSizeQuota[]: "" is not a VM name: ` + vmKeyRule},
		{name: "every mistake at once, in field order", obj: quota(all(named("q"), namespaceQuota("-1"),
			vmQuota("b-vm", "-2"), vmQuota("A", "-3"))),
			wantMsg: `metadata.name: Strata reads only the ResourceQuota named default-resource-quota in each namespace; "q" would have no effect; ` +
				`spec.snapshotLimit.namespaceTotalSnapshotSizeQuota: must not be negative, got -1; ` +
				`spec.snapshotLimit.vmTotalSnapshotSizeQuota[A]: "A" is not a VM name: ` + vmKeyRule + `; ` +
				`spec.snapshotLimit.vmTotalSnapshotSizeQuota[A]: must not be negative, got -3; ` +
				`spec.snapshotLimit.vmTotalSnapshotSizeQuota[b-vm]: must not be negative, got -2`},
	}
	h := admissiontest.NewHandler(t, nil, NewValidator())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for op, old := range map[string]*v1beta1.ResourceQuota{"create": nil, "update": quota(named(tc.obj.Name))} {
				resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, old, tc.obj))
				assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp), op)
				if tc.wantMsg != "" {
					require.NotNil(t, resp.Result)
					assert.Equal(t, int32(http.StatusUnprocessableEntity), resp.Result.Code, op)
				}
			}
		})
	}
}

// A quota lives in a user's namespace; the framework confines every other
// kind to strata-system.
func TestValidatorAnyNamespace(t *testing.T) {
	h := admissiontest.NewHandler(t, nil, NewValidator())
	for _, ns := range []string{"default", "team-b", admissiontest.Namespace} {
		rq := quota(func(rq *v1beta1.ResourceQuota) { rq.Namespace = ns })
		assert.Empty(t, admissiontest.Denial(h.Validate(admissiontest.Request(Resource, admissiontest.Admin, nil, rq))), ns)
	}
}

// A quota being deleted may lose its finalizers whatever it holds; status
// writes are never judged.
func TestValidatorLetsThrough(t *testing.T) {
	h := admissiontest.NewHandler(t, nil, NewValidator())
	bad := all(named("old-quota"), namespaceQuota("-1Gi"))

	deleting := quota(all(bad, func(rq *v1beta1.ResourceQuota) {
		rq.DeletionTimestamp = &metav1.Time{Time: time.Unix(1e9, 0)}
		rq.Finalizers = []string{"example.com/keep"}
	}))
	released := deleting.DeepCopy()
	released.Finalizers = nil
	assert.Empty(t, admissiontest.Denial(h.Validate(admissiontest.Request(Resource, admissiontest.Admin, deleting, released))),
		"finalizer removed from a quota being deleted")

	req := admissiontest.Request(Resource, admissiontest.Manager, quota(bad), quota(bad))
	req.SubResource = "status"
	assert.Empty(t, admissiontest.Denial(h.Validate(req)), "status write")
}
