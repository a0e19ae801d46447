package quota

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ResourceQuotaController keeps each namespace's default-resource-quota
// status equal to the snapshot space its volumes, and each of its VMs'
// volumes, use. Its key is the quota's namespace/name; a change enqueues
// only the one namespace it touches.
type ResourceQuotaController struct {
	*kit.BaseController
}

// NewResourceQuotaController wires the controller to the quota informer, the
// snapshot usage tracker, the PVs (which claim a volume serves) and, once
// KubeVirt is installed, the VMs.
func NewResourceQuotaController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string) (*ResourceQuotaController, error) {
	c := &ResourceQuotaController{BaseController: kit.NewBaseController("strata-resource-quota", controllerID, logger, ds, recorder)}
	c.Sync = c.syncResourceQuota
	if err := c.RequeueOnNodeReadyChange(c.EnqueueEveryKey(ds.ResourceQuotas.Informer())); err != nil {
		return nil, err
	}
	if _, err := ds.ResourceQuotas.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.Enqueue,
		// A new limit, not our own status write, needs a look.
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.ResourceQuota) {
			if o.Generation != n.Generation {
				c.Enqueue(n)
			}
		}),
	}); err != nil {
		return nil, err
	}
	ds.SnapshotUsage.OnChange(c.enqueueVolume)
	// Deleted snapshots' data still on disk counts too.
	if _, err := ds.Volumes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Volume) {
			if o.Status.RemovedSnapshotsSize != n.Status.RemovedSnapshotsSize {
				c.enqueueVolume(n.Name)
			}
		}),
	}); err != nil {
		return nil, err
	}
	if _, err := ds.PersistentVolumeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(c.enqueuePV),
		UpdateFunc: kit.OnUpdate(func(o, n *corev1.PersistentVolume) {
			if pvBinding(o) != pvBinding(n) {
				c.enqueuePV(o)
				c.enqueuePV(n)
			}
		}),
		DeleteFunc: kit.OnDelete(c.enqueuePV),
	}); err != nil {
		return nil, err
	}
	if ok := ds.OptionalKinds; ok != nil {
		if err := ok.AddVirtualMachineHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: kit.OnAdd(c.enqueueVM),
			UpdateFunc: kit.OnUpdate(func(o, n *unstructured.Unstructured) {
				if !sameClaims(o, n) {
					c.enqueueVM(n)
				}
			}),
			DeleteFunc: kit.OnDelete(c.enqueueVM),
		}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// enqueueNamespace enqueues the namespace's quota, if it has one: without
// one there is no status to keep.
func (c *ResourceQuotaController) enqueueNamespace(namespace string) {
	if namespace == "" {
		return
	}
	if _, ok := c.DS.NamespaceQuota(namespace); ok {
		c.Queue.Add(namespace + "/" + v1beta1.DefaultResourceQuotaName)
	}
}

func (c *ResourceQuotaController) enqueueVolume(volume string) {
	if claim, ok := c.DS.ClaimOfVolume(volume); ok {
		c.enqueueNamespace(claim.Namespace)
	}
}

func (c *ResourceQuotaController) enqueuePV(pv *corev1.PersistentVolume) {
	c.enqueueNamespace(claimNamespace(pv))
}

func (c *ResourceQuotaController) enqueueVM(vm *unstructured.Unstructured) {
	c.enqueueNamespace(vm.GetNamespace())
}

// claimNamespace is the namespace of the claim bound to a Strata PV.
func claimNamespace(pv *corev1.PersistentVolume) string {
	if datastore.StrataVolumeHandle(pv) == "" || pv.Spec.ClaimRef == nil {
		return ""
	}
	return pv.Spec.ClaimRef.Namespace
}

// pvBinding is what of a PV decides whose usage its volume counts in; PV
// status changes leave it alone.
func pvBinding(pv *corev1.PersistentVolume) string {
	return claimNamespace(pv) + "/" + datastore.StrataVolumeHandle(pv)
}

func sameClaims(o, n *unstructured.Unstructured) bool {
	return slices.Equal(datastore.VirtualMachineClaims(o), datastore.VirtualMachineClaims(n))
}
