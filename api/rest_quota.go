package api

import (
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The space-management seed's quota actions, on Strata's paths. Status
// codes as the seed lists them: 200 for a namespace, 204 for a VM.
func quotaRoutes() []route {
	return []route{
		{method: http.MethodPost, path: "/v1/namespaces/{namespace}", actions: map[string]func(*call) error{
			"updateResourceQuota": func(c *call) error { return c.updateQuota(c.r.PathValue("namespace"), "", http.StatusOK) },
			"deleteResourceQuota": func(c *call) error { return c.deleteQuota(c.r.PathValue("namespace"), "", http.StatusOK) },
		}},
		{method: http.MethodPost, path: "/v1/virtualmachines/{namespace}/{name}", actions: map[string]func(*call) error{
			"updateResourceQuota": func(c *call) error {
				return c.updateQuota(c.r.PathValue("namespace"), c.r.PathValue("name"), http.StatusNoContent)
			},
			"deleteResourceQuota": func(c *call) error {
				return c.deleteQuota(c.r.PathValue("namespace"), c.r.PathValue("name"), http.StatusNoContent)
			},
		}},
	}
}

// quotaRequest is the body of updateResourceQuota.
type quotaRequest struct {
	TotalSnapshotSizeQuota string `json:"totalSnapshotSizeQuota"`
}

// updateQuota sets the namespace's quota (vm "") or a VM's in the
// namespace's ResourceQuota, creating it if needed.
func (c *call) updateQuota(namespace, vm string, okCode int) error {
	var req quotaRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	quota, err := parseQuantity("totalSnapshotSizeQuota", req.TotalSnapshotSizeQuota, "10Gi", true)
	if err != nil {
		return err
	}
	return c.editQuota(namespace, vm, okCode, func(l *v1beta1.SnapshotLimit) {
		if vm == "" {
			l.NamespaceTotalSnapshotSizeQuota = &quota
			return
		}
		if l.VMTotalSnapshotSizeQuota == nil {
			l.VMTotalSnapshotSizeQuota = map[string]resource.Quantity{}
		}
		l.VMTotalSnapshotSizeQuota[vm] = quota
	})
}

// deleteQuota removes the namespace's quota (vm "") or a VM's; the
// ResourceQuota itself stays (its usage is still reported).
func (c *call) deleteQuota(namespace, vm string, okCode int) error {
	return c.editQuota(namespace, vm, okCode, func(l *v1beta1.SnapshotLimit) {
		if vm == "" {
			l.NamespaceTotalSnapshotSizeQuota = nil
			return
		}
		delete(l.VMTotalSnapshotSizeQuota, vm)
	})
}

// editQuota applies edit to the namespace's ResourceQuota as the caller.
func (c *call) editQuota(namespace, vm string, okCode int, edit func(*v1beta1.SnapshotLimit)) error {
	if err := c.authorize("update", "resourcequotas", namespace, v1beta1.DefaultResourceQuotaName); err != nil {
		return err
	}
	if vm != "" {
		if err := c.vmExists(namespace, vm); err != nil {
			return err
		}
	}
	strata, err := c.strata()
	if err != nil {
		return err
	}
	quotas := strata.StrataV1beta1().ResourceQuotas(namespace)
	var written *v1beta1.ResourceQuota
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		rq, err := quotas.Get(c.ctx(), v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// A first quota is a create: reviewed as one, since a
			// certificate user's write is made with the manager's rights.
			if err := c.authorize("create", "resourcequotas", namespace, v1beta1.DefaultResourceQuotaName); err != nil {
				return err
			}
			rq = &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: namespace}}
			edit(&rq.Spec.SnapshotLimit)
			c.stamp(rq)
			written, err = quotas.Create(c.ctx(), rq, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		edit(&rq.Spec.SnapshotLimit)
		c.stamp(rq)
		written, err = quotas.Update(c.ctx(), rq, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	c.wrote(written, namespace+"/"+written.Name, "snapshot quota set")
	if okCode == http.StatusNoContent {
		return c.reply(okCode, nil)
	}
	return c.reply(okCode, written)
}

// vmExists: a VM's quota is for a VM the cluster has (KubeVirt's kind,
// from the manager's cache).
func (c *call) vmExists(namespace, name string) error {
	kinds := c.opts.Cache.OptionalKinds
	if kinds == nil {
		return fmt.Errorf("virtual machine %s/%s: %w (VirtualMachines are not watched)", namespace, name, errNotFound)
	}
	if _, ok := kinds.VirtualMachine(namespace, name); !ok {
		return fmt.Errorf("virtual machine %s/%s: %w", namespace, name, errNotFound)
	}
	return nil
}
