package quota

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// syncResourceQuota writes the quota's usage: the snapshot bytes of the
// namespace's volumes and of each VM's. Every figure is a sum of per-volume
// totals the datastore keeps (SnapshotUsage), so a sync costs one lookup
// per volume of the namespace. Nothing is written when nothing changed.
func (c *ResourceQuotaController) syncResourceQuota(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil || name != v1beta1.DefaultResourceQuotaName {
		return nil // the webhook refuses any other name; Strata never reads one
	}
	rqRO, err := c.DS.ResourceQuotas.GetInNamespaceRO(namespace, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	// Quotas have no owner node; any one alive manager keeps each.
	if responsible, err := c.IsResponsibleFor(key, "", ""); err != nil || !responsible {
		return err
	}
	want := c.snapshotUsage(rqRO)
	if sameUsage(rqRO.Status.SnapshotLimitStatus, want) {
		return nil
	}
	rq := rqRO.DeepCopy()
	rq.Status.SnapshotLimitStatus = want
	_, err = c.DS.ResourceQuotas.UpdateStatus(ctx, rq)
	return err
}

// snapshotUsage is the usage the quota's status should show: the
// namespace's total, and a total for every VM of the namespace with Strata
// volumes or a quota of its own.
func (c *ResourceQuotaController) snapshotUsage(rq *v1beta1.ResourceQuota) v1beta1.SnapshotLimitStatus {
	volumes := c.DS.VolumesInNamespace(rq.Namespace)
	st := v1beta1.SnapshotLimitStatus{
		NamespaceTotalSnapshotSizeUsage:   bytesQuantity(c.DS.SnapshotBytesOf(volumes)),
		NamespaceRemovedSnapshotSizeUsage: bytesQuantity(c.DS.RemovedBytesOf(volumes)),
	}
	vms := map[string]resource.Quantity{}
	for name := range rq.Spec.SnapshotLimit.VMTotalSnapshotSizeQuota {
		vms[name] = *bytesQuantity(0)
	}
	for _, vm := range c.DS.OptionalKinds.VirtualMachinesIn(rq.Namespace) {
		volumes := c.DS.VirtualMachineVolumes(vm)
		if _, quoted := vms[vm.GetName()]; len(volumes) > 0 || quoted {
			vms[vm.GetName()] = *bytesQuantity(c.DS.SnapshotBytesOf(volumes))
		}
	}
	if len(vms) > 0 {
		st.VMTotalSnapshotSizeUsage = vms
	}
	return st
}

func bytesQuantity(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.BinarySI) }

// sameUsage compares by value: a quantity read back from the API server
// prints differently from one made here.
func sameUsage(a, b v1beta1.SnapshotLimitStatus) bool {
	if !sameQuantity(a.NamespaceTotalSnapshotSizeUsage, b.NamespaceTotalSnapshotSizeUsage) ||
		!sameQuantity(a.NamespaceRemovedSnapshotSizeUsage, b.NamespaceRemovedSnapshotSizeUsage) ||
		len(a.VMTotalSnapshotSizeUsage) != len(b.VMTotalSnapshotSizeUsage) {
		return false
	}
	for name, q := range a.VMTotalSnapshotSizeUsage {
		other, ok := b.VMTotalSnapshotSizeUsage[name]
		if !ok || q.Cmp(other) != 0 {
			return false
		}
	}
	return true
}

func sameQuantity(a, b *resource.Quantity) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Cmp(*b) == 0)
}
