package instance

import (
	"fmt"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// InstanceManagerRolloutController replaces this node's instance-manager
// Pod when its DaemonSet has a newer revision (after helm upgrade: the
// DaemonSets are OnDelete) and nothing on the node is in use: no volume
// with an engine or a replica here is attached. Replacing it then costs no
// I/O and no rebuild. It waits, too, while another node's instance manager
// is not ready, so the nodes go one after another, not all at once. Its
// verdict is the InstanceManager's UpToDate condition.
//
// It runs only where the instance managers are Pods (the chart's managers
// are given their label selector); its one key is this node.
type InstanceManagerRolloutController struct {
	*kit.BaseController
	pods *datastore.InstanceManagerPods
}

// NewInstanceManagerRolloutController wires the controller for the
// instance-manager Pod of node controllerID. ds.WatchInstanceManagerPods
// must have been called.
func NewInstanceManagerRolloutController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string) (*InstanceManagerRolloutController, error) {
	if ds.InstanceManagerPods == nil {
		return nil, fmt.Errorf("the instance manager rollout needs the instance managers' Pods watched")
	}
	c := &InstanceManagerRolloutController{
		BaseController: kit.NewBaseController("strata-instance-manager-rollout", controllerID, logger, ds, recorder),
		pods:           ds.InstanceManagerPods,
	}
	c.Sync = c.syncRollout
	always := func(any) { c.Queue.Add(c.key()) }
	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		// Any instance-manager Pod (another node's readiness gates ours)
		// and any revision (a new one is the upgrade).
		{c.pods.PodInformer, kit.OnEveryChange(always)},
		{c.pods.RevisionsInformer, kit.OnEveryChange(always)},
		{ds.InstanceManagers.Informer(), cache.FilteringResourceEventHandler{
			FilterFunc: kit.FilterFor(func(im *v1beta1.InstanceManager) bool { return im.Spec.NodeID == controllerID }),
			Handler:    kit.OnEveryChange(always)}},
		// What holds the node in use, only while the Pod is outdated: an
		// idle cluster or an up-to-date Pod adds nothing to the queue.
		{ds.Engines.Informer(), whileOutdated(c, func(e *v1beta1.Engine) bool { return e.Spec.NodeID == controllerID })},
		{ds.Replicas.Informer(), whileOutdated(c, func(r *v1beta1.Replica) bool { return r.Spec.NodeID == controllerID })},
		{ds.Volumes.Informer(), whileOutdated(c, func(*v1beta1.Volume) bool { return true })},
	}
	for _, h := range handlers {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// whileOutdated enqueues this node on a change of an object keep accepts,
// while this node's instance-manager Pod runs an old revision.
func whileOutdated[T any](c *InstanceManagerRolloutController, keep func(T) bool) cache.ResourceEventHandler {
	return cache.FilteringResourceEventHandler{
		FilterFunc: func(obj any) bool { return kit.FilterFor(keep)(obj) && c.outdated() },
		Handler:    kit.OnEveryChange(func(T) { c.Queue.Add(c.key()) }),
	}
}

func (c *InstanceManagerRolloutController) key() string { return c.ControllerID }

// ownPod is this node's instance-manager Pod (not one being deleted), or nil.
func (c *InstanceManagerRolloutController) ownPod() (*corev1.Pod, error) {
	pods, err := c.pods.Pods.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if p.Spec.NodeName == c.ControllerID && p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return nil, nil
}
