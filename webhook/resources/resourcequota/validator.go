// Package resourcequota holds the ResourceQuota admission rules (seed
// snapshot-space-management, test plan 1): Strata reads one quota per
// namespace, named default-resource-quota, so no other name is accepted; a
// quota is never negative; a per-VM quota is keyed by a name a VM can have.
//
// The API server refuses a value that is no quantity ("abc") before the
// webhook sees the object: the CRD schema's pattern names the field. A
// negative namespace quota is refused by the CRD's CEL rule too; the webhook
// repeats that rule so that a quota is judged in one place whatever the CRD.
package resourcequota

import (
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
)

// Resource is strata.io/v1beta1 resourcequotas, which live in users'
// namespaces.
var Resource = admission.Resource{
	GroupResource: v1beta1.Resource("resourcequotas"),
	Version:       v1beta1.SchemeGroupVersion.Version,
	Kind:          "ResourceQuota",
	NewObject:     func() runtime.Object { return &v1beta1.ResourceQuota{} },
	AnyNamespace:  true,
}

var (
	namePath           = field.NewPath("metadata", "name")
	snapshotLimitPath  = field.NewPath("spec", "snapshotLimit")
	namespaceQuotaPath = snapshotLimitPath.Child("namespaceTotalSnapshotSizeQuota")
	vmQuotaPath        = snapshotLimitPath.Child("vmTotalSnapshotSizeQuota")
)

type validator struct{}

// NewValidator returns the ResourceQuota validator. It needs no cache: every
// rule reads only the object.
func NewValidator() admission.Validator { return validator{} }

func (validator) Resource() admission.Resource { return Resource }

func (validator) Create(_ *admission.Request, obj runtime.Object) error {
	return validQuota(obj.(*v1beta1.ResourceQuota))
}

// Update judges the whole object, not only what changed: a quota stored
// before the webhook judged it (another name, a negative value) is refused
// until it is fixed, rather than edited on and silently ignored. A quota
// being deleted is let through, so that whoever holds a finalizer on it can
// always remove it. Status writes go through the status subresource and are
// never sent here.
func (validator) Update(_ *admission.Request, _, newObj runtime.Object) error {
	rq := newObj.(*v1beta1.ResourceQuota)
	if rq.DeletionTimestamp != nil {
		return nil
	}
	return validQuota(rq)
}

func validQuota(rq *v1beta1.ResourceQuota) error {
	var errs admission.FieldErrors
	if rq.Name != v1beta1.DefaultResourceQuotaName {
		errs.Add(admission.Invalid(namePath, "Strata reads only the ResourceQuota named %s in each namespace; %q would have no effect",
			v1beta1.DefaultResourceQuotaName, rq.Name))
	}
	limit := rq.Spec.SnapshotLimit
	if q := limit.NamespaceTotalSnapshotSizeQuota; q != nil {
		errs.Add(notNegative(namespaceQuotaPath, *q))
	}
	for _, vm := range slices.Sorted(maps.Keys(limit.VMTotalSnapshotSizeQuota)) {
		path := vmQuotaPath.Key(vm)
		if msgs := validation.IsDNS1123Subdomain(vm); len(msgs) > 0 {
			errs.Add(admission.Invalid(path, "%q is not a VM name: %s", vm, strings.Join(msgs, "; ")))
		}
		errs.Add(notNegative(path, limit.VMTotalSnapshotSizeQuota[vm]))
	}
	return errs.Err()
}

// notNegative allows zero: the seed's test plan denies negative values only.
func notNegative(path *field.Path, q resource.Quantity) *admission.FieldError {
	if q.Sign() < 0 {
		return admission.Invalid(path, "must not be negative, got %s", q.String())
	}
	return nil
}
