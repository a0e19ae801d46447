package datastore

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// InstanceManagerPods is the cache of the instance managers' Pods and of
// their DaemonSets' ControllerRevisions, in the manager's namespace and
// matching one label selector: what the rollout controller needs to tell
// an instance manager running an old revision. Nil when the instance
// managers are not Pods (the process mode).
type InstanceManagerPods struct {
	Pods              corelisters.PodNamespaceLister
	PodInformer       cache.SharedIndexInformer
	Revisions         appslisters.ControllerRevisionNamespaceLister
	RevisionsInformer cache.SharedIndexInformer
}

// WatchInstanceManagerPods watches the Pods and ControllerRevisions of
// ds.Namespace that match selector (a label selector, such as
// app=strata-instance-manager). Call it before Start.
func (ds *DataStore) WatchInstanceManagerPods(selector string) error {
	if _, err := labels.Parse(selector); err != nil {
		return fmt.Errorf("instance manager Pod selector %q: %w", selector, err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(ds.KubeClient, ResyncPeriod, informers.WithNamespace(ds.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	pods, revisions := f.Core().V1().Pods(), f.Apps().V1().ControllerRevisions()
	ds.InstanceManagerPods = &InstanceManagerPods{
		Pods: pods.Lister().Pods(ds.Namespace), PodInformer: pods.Informer(),
		Revisions: revisions.Lister().ControllerRevisions(ds.Namespace), RevisionsInformer: revisions.Informer(),
	}
	ds.factories = append(ds.factories, f)
	ds.synced = append(ds.synced, ds.InstanceManagerPods.PodInformer.HasSynced, ds.InstanceManagerPods.RevisionsInformer.HasSynced)
	return nil
}

// NewestRevision is the newest ControllerRevision owned by the DaemonSet
// with UID owner, or nil.
func (p *InstanceManagerPods) NewestRevision(owner string) (*appsv1.ControllerRevision, error) {
	all, err := p.Revisions.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var newest *appsv1.ControllerRevision
	for _, r := range all {
		if ref := metav1.GetControllerOf(r); ref == nil || string(ref.UID) != owner {
			continue
		}
		if newest == nil || r.Revision > newest.Revision {
			newest = r
		}
	}
	return newest, nil
}
