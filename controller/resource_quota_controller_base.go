package controller

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ResourceQuotaController keeps each namespace's default-resource-quota
// status equal to the snapshot space its volumes, and each of its VMs'
// volumes, use. Its key is the quota's namespace/name; a change enqueues
// only the one namespace it touches.
type ResourceQuotaController struct {
	*baseController
}

// NewResourceQuotaController wires the controller to the quota informer, the
// snapshot usage tracker, the PVs (which claim a volume serves) and, once
// KubeVirt is installed, the VMs.
func NewResourceQuotaController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string) (*ResourceQuotaController, error) {
	c := &ResourceQuotaController{baseController: newBaseController("strata-resource-quota", controllerID, logger, ds, recorder)}
	c.sync = c.syncResourceQuota
	if err := c.requeueOnNodeReadyChange(c.enqueueEveryKey(ds.ResourceQuotas.Informer())); err != nil {
		return nil, err
	}
	if _, err := ds.ResourceQuotas.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		// A new limit, not our own status write, needs a look.
		UpdateFunc: func(oldObj, newObj any) {
			if oldObj.(*v1beta1.ResourceQuota).Generation != newObj.(*v1beta1.ResourceQuota).Generation {
				c.enqueue(newObj)
			}
		},
	}); err != nil {
		return nil, err
	}
	ds.SnapshotUsage.OnChange(c.enqueueVolume)
	if _, err := ds.PersistentVolumeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { c.enqueuePV(obj) },
		UpdateFunc: func(oldObj, newObj any) {
			if pvBinding(oldObj) != pvBinding(newObj) {
				c.enqueuePV(oldObj)
				c.enqueuePV(newObj)
			}
		},
		DeleteFunc: func(obj any) { c.enqueuePV(tombstoneObject(obj)) },
	}); err != nil {
		return nil, err
	}
	if ok := ds.OptionalKinds; ok != nil {
		if err := ok.AddVirtualMachineHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: c.enqueueVM,
			UpdateFunc: func(oldObj, newObj any) {
				if !sameClaims(oldObj, newObj) {
					c.enqueueVM(newObj)
				}
			},
			DeleteFunc: func(obj any) { c.enqueueVM(tombstoneObject(obj)) },
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
	if _, ok := c.ds.NamespaceQuota(namespace); ok {
		c.queue.Add(namespace + "/" + v1beta1.DefaultResourceQuotaName)
	}
}

func (c *ResourceQuotaController) enqueueVolume(volume string) {
	if claim, ok := c.ds.ClaimOfVolume(volume); ok {
		c.enqueueNamespace(claim.Namespace)
	}
}

func (c *ResourceQuotaController) enqueuePV(obj any) { c.enqueueNamespace(claimNamespace(obj)) }

func (c *ResourceQuotaController) enqueueVM(obj any) {
	if vm, ok := obj.(*unstructured.Unstructured); ok {
		c.enqueueNamespace(vm.GetNamespace())
	}
}

// claimNamespace is the namespace of the claim bound to a Strata PV.
func claimNamespace(obj any) string {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || datastore.StrataVolumeHandle(pv) == "" || pv.Spec.ClaimRef == nil {
		return ""
	}
	return pv.Spec.ClaimRef.Namespace
}

// pvBinding is what of a PV decides whose usage its volume counts in; PV
// status changes leave it alone.
func pvBinding(obj any) string {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok {
		return ""
	}
	return claimNamespace(obj) + "/" + datastore.StrataVolumeHandle(pv)
}

func sameClaims(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*unstructured.Unstructured)
	n, ok2 := newObj.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return false
	}
	return slices.Equal(datastore.VirtualMachineClaims(o), datastore.VirtualMachineClaims(n))
}
