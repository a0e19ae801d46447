// Package datastore is the one cache facade the controllers read through:
// shared informers (resync 0) for Strata's kinds and the core kinds Strata
// needs, the indexers for by-volume/by-node/by-disk/by-backing-image lookups,
// and typed writes.
package datastore

import (
	"context"
	"fmt"
	"slices"

	"github.com/sirupsen/logrus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/k8s/pkg/client/informers/externalversions"
	"github.com/strata-storage/strata/types"
)

// ResyncPeriod is 0 for every informer: controllers act on changes and on
// their own timers, never on a periodic replay of the whole cache.
const ResyncPeriod = 0

// DataStore is the shared cache and typed client of one manager.
type DataStore struct {
	Namespace    string
	StrataClient versioned.Interface
	KubeClient   kubernetes.Interface
	// Clock tells lease expiry; tests replace it.
	Clock clock.PassiveClock

	Volumes           *Store[*v1beta1.Volume]
	Engines           *Store[*v1beta1.Engine]
	Replicas          *Store[*v1beta1.Replica]
	Snapshots         *Store[*v1beta1.Snapshot]
	VolumeAttachments *Store[*v1beta1.VolumeAttachment]
	BackingImages     *Store[*v1beta1.BackingImage]
	Nodes             *Store[*v1beta1.Node]
	Settings          *Store[*v1beta1.Setting]
	BackupTargets     *Store[*v1beta1.BackupTarget]
	BackupVolumes     *Store[*v1beta1.BackupVolume]
	Backups           *Store[*v1beta1.Backup]
	RecurringJobs     *Store[*v1beta1.RecurringJob]
	InstanceManagers  *Store[*v1beta1.InstanceManager]
	SnapshotGroups    *Store[*v1beta1.SnapshotGroup]
	// SnapshotUsage is the bytes each volume's snapshots hold, for quotas.
	SnapshotUsage *SnapshotUsage
	// OptionalKinds are other projects' kinds (KubeVirt, Harvester), watched
	// once their CRDs exist; nil until WatchOptionalKinds.
	OptionalKinds *OptionalKinds
	// ResourceQuotas live in user namespaces, so this store watches them all.
	ResourceQuotas *Store[*v1beta1.ResourceQuota]
	// StorageVolumeAttachments are Kubernetes' own (storage.k8s.io,
	// cluster-scoped) VolumeAttachments, which CSI attachment tickets name as
	// their owners. Read-only.
	StorageVolumeAttachments *Store[*storagev1.VolumeAttachment]
	// APITicketLeases are the Leases that own the REST API's attachment
	// tickets (label strata.io/component=api-ticket), in Namespace.
	APITicketLeases *Store[*coordinationv1.Lease]
	// InstanceManagerPods is set by WatchInstanceManagerPods (the chart's
	// managers); nil otherwise.
	InstanceManagerPods *InstanceManagerPods

	KubeNodes              corelisters.NodeLister
	PersistentVolumes      corelisters.PersistentVolumeLister
	PersistentVolumeClaims corelisters.PersistentVolumeClaimLister
	Namespaces             corelisters.NamespaceLister
	// ServiceCIDRs are the cluster's Service IP ranges (networking.k8s.io/v1,
	// GA in Kubernetes 1.33; "kubernetes" is the one the API server makes
	// from its --service-cluster-ip-range), which downloads may not reach.
	ServiceCIDRs networkinglisters.ServiceCIDRLister
	// Leases holds the managers' heartbeat Leases in Namespace only.
	Leases        coordinationlisters.LeaseNamespaceLister
	LeaseInformer cache.SharedIndexInformer
	KubeNodeInformer,
	PersistentVolumeInformer,
	PersistentVolumeClaimInformer,
	NamespaceInformer,
	ServiceCIDRInformer cache.SharedIndexInformer

	factories []interface{ Start(<-chan struct{}) }
	runners   []func(context.Context)
	synced    []cache.InformerSynced
}

// New builds the informers for every kind on the given clients. Nothing runs
// until Start.
func New(namespace string, strataClient versioned.Interface, kubeClient kubernetes.Interface) (*DataStore, error) {
	return NewWatching(namespace, strataClient, kubeClient, nil)
}

// NewWatching is New for a process that reads only some kinds (the CSI
// controller plugin): only the kinds listed are watched, so its
// ServiceAccount needs list and watch on those alone. A Store of a kind not
// watched still writes, and its reads fail with an error naming the kind
// (never a silent NotFound); the listers of core kinds not watched
// (KubeNodes, PersistentVolumes, PersistentVolumeClaims, Namespaces,
// ServiceCIDRs, Leases) and their informers are nil. nil kinds means every kind.
func NewWatching(namespace string, strataClient versioned.Interface, kubeClient kubernetes.Interface,
	kinds []schema.GroupResource) (*DataStore, error) {
	ds := &DataStore{Namespace: namespace, StrataClient: strataClient, KubeClient: kubeClient, Clock: clock.RealClock{}}

	strataFactory := externalversions.NewSharedInformerFactoryWithOptions(strataClient, ResyncPeriod,
		externalversions.WithNamespace(namespace))
	quotaFactory := externalversions.NewSharedInformerFactory(strataClient, ResyncPeriod)
	kubeFactory := informers.NewSharedInformerFactory(kubeClient, ResyncPeriod)
	leaseFactory := informers.NewSharedInformerFactoryWithOptions(kubeClient, ResyncPeriod,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = types.LabelComponent + "=" + types.ComponentNodeLease
		}))
	apiTicketFactory := informers.NewSharedInformerFactoryWithOptions(kubeClient, ResyncPeriod,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = types.LabelComponent + "=" + types.ComponentAPITicket
		}))
	ds.factories = []interface{ Start(<-chan struct{}) }{strataFactory, quotaFactory, kubeFactory, leaseFactory, apiTicketFactory}

	s := strataFactory.Strata().V1beta1()
	typed := strataClient.StrataV1beta1()
	var err error
	watched := func(gr schema.GroupResource) bool { return kinds == nil || slices.Contains(kinds, gr) }
	// add makes (and so registers with its factory) the informer of a
	// watched kind; nil for one not watched.
	add := func(gr schema.GroupResource, informer func() cache.SharedIndexInformer, indexers cache.Indexers) cache.SharedIndexInformer {
		if !watched(gr) {
			return nil
		}
		inf := informer()
		if err == nil && len(indexers) > 0 {
			err = inf.AddIndexers(indexers)
		}
		ds.synced = append(ds.synced, inf.HasSynced)
		return inf
	}

	ds.Volumes = newStore(v1beta1.Resource("volumes"), namespace, add(v1beta1.Resource("volumes"), s.Volumes().Informer, volumeIndexers),
		func(ns string) objectClient[*v1beta1.Volume] { return typed.Volumes(ns) })
	ds.Engines = newStore(v1beta1.Resource("engines"), namespace, add(v1beta1.Resource("engines"), s.Engines().Informer, engineIndexers),
		func(ns string) objectClient[*v1beta1.Engine] { return typed.Engines(ns) })
	ds.Replicas = newStore(v1beta1.Resource("replicas"), namespace, add(v1beta1.Resource("replicas"), s.Replicas().Informer, replicaIndexers),
		func(ns string) objectClient[*v1beta1.Replica] { return typed.Replicas(ns) })
	ds.Snapshots = newStore(v1beta1.Resource("snapshots"), namespace, add(v1beta1.Resource("snapshots"), s.Snapshots().Informer, snapshotIndexers),
		func(ns string) objectClient[*v1beta1.Snapshot] { return typed.Snapshots(ns) })
	ds.SnapshotUsage = newSnapshotUsage()
	if inf := ds.Snapshots.Informer(); inf != nil {
		if _, herr := inf.AddEventHandler(ds.SnapshotUsage.handler()); herr != nil {
			return nil, herr
		}
	}
	ds.VolumeAttachments = newStore(v1beta1.Resource("volumeattachments"), namespace,
		add(v1beta1.Resource("volumeattachments"), s.VolumeAttachments().Informer, volumeAttachmentIndexers),
		func(ns string) objectClient[*v1beta1.VolumeAttachment] { return typed.VolumeAttachments(ns) })
	ds.BackingImages = newStore(v1beta1.Resource("backingimages"), namespace,
		add(v1beta1.Resource("backingimages"), s.BackingImages().Informer, backingImageIndexers),
		func(ns string) objectClient[*v1beta1.BackingImage] { return typed.BackingImages(ns) })
	ds.Nodes = newStore(v1beta1.Resource("nodes"), namespace, add(v1beta1.Resource("nodes"), s.Nodes().Informer, nodeIndexers),
		func(ns string) objectClient[*v1beta1.Node] { return typed.Nodes(ns) })
	ds.Settings = newStore(v1beta1.Resource("settings"), namespace, add(v1beta1.Resource("settings"), s.Settings().Informer, nil),
		func(ns string) objectClient[*v1beta1.Setting] { return typed.Settings(ns) })
	ds.BackupTargets = newStore(v1beta1.Resource("backuptargets"), namespace,
		add(v1beta1.Resource("backuptargets"), s.BackupTargets().Informer, nil),
		func(ns string) objectClient[*v1beta1.BackupTarget] { return typed.BackupTargets(ns) })
	ds.BackupVolumes = newStore(v1beta1.Resource("backupvolumes"), namespace,
		add(v1beta1.Resource("backupvolumes"), s.BackupVolumes().Informer, nil),
		func(ns string) objectClient[*v1beta1.BackupVolume] { return typed.BackupVolumes(ns) })
	ds.Backups = newStore(v1beta1.Resource("backups"), namespace, add(v1beta1.Resource("backups"), s.Backups().Informer, backupIndexers),
		func(ns string) objectClient[*v1beta1.Backup] { return typed.Backups(ns) })
	ds.RecurringJobs = newStore(v1beta1.Resource("recurringjobs"), namespace,
		add(v1beta1.Resource("recurringjobs"), s.RecurringJobs().Informer, nil),
		func(ns string) objectClient[*v1beta1.RecurringJob] { return typed.RecurringJobs(ns) })
	ds.InstanceManagers = newStore(v1beta1.Resource("instancemanagers"), namespace,
		add(v1beta1.Resource("instancemanagers"), s.InstanceManagers().Informer, instanceManagerIndexers),
		func(ns string) objectClient[*v1beta1.InstanceManager] { return typed.InstanceManagers(ns) })
	ds.SnapshotGroups = newStore(v1beta1.Resource("snapshotgroups"), namespace,
		add(v1beta1.Resource("snapshotgroups"), s.SnapshotGroups().Informer, snapshotGroupIndexers),
		func(ns string) objectClient[*v1beta1.SnapshotGroup] { return typed.SnapshotGroups(ns) })
	ds.ResourceQuotas = newStore(v1beta1.Resource("resourcequotas"), "",
		add(v1beta1.Resource("resourcequotas"), quotaFactory.Strata().V1beta1().ResourceQuotas().Informer, nil),
		func(ns string) objectClient[*v1beta1.ResourceQuota] { return typed.ResourceQuotas(ns) })

	ds.StorageVolumeAttachments = newStore(storagev1.Resource("volumeattachments"), "",
		add(storagev1.Resource("volumeattachments"), kubeFactory.Storage().V1().VolumeAttachments().Informer, nil),
		func(string) objectClient[*storagev1.VolumeAttachment] {
			return kubeClient.StorageV1().VolumeAttachments()
		})

	core := kubeFactory.Core().V1()
	if ds.KubeNodeInformer = add(corev1.Resource("nodes"), core.Nodes().Informer, nil); ds.KubeNodeInformer != nil {
		ds.KubeNodes = core.Nodes().Lister()
	}
	if ds.PersistentVolumeInformer = add(corev1.Resource("persistentvolumes"), core.PersistentVolumes().Informer,
		persistentVolumeIndexers); ds.PersistentVolumeInformer != nil {
		ds.PersistentVolumes = core.PersistentVolumes().Lister()
	}
	if ds.PersistentVolumeClaimInformer = add(corev1.Resource("persistentvolumeclaims"), core.PersistentVolumeClaims().Informer,
		nil); ds.PersistentVolumeClaimInformer != nil {
		ds.PersistentVolumeClaims = core.PersistentVolumeClaims().Lister()
	}
	if ds.NamespaceInformer = add(corev1.Resource("namespaces"), core.Namespaces().Informer, nil); ds.NamespaceInformer != nil {
		ds.Namespaces = core.Namespaces().Lister()
	}
	serviceCIDRs := kubeFactory.Networking().V1().ServiceCIDRs()
	if ds.ServiceCIDRInformer = add(networkingv1.Resource("servicecidrs"), serviceCIDRs.Informer, nil); ds.ServiceCIDRInformer != nil {
		ds.ServiceCIDRs = serviceCIDRs.Lister()
	}
	leases := leaseFactory.Coordination().V1().Leases()
	if ds.LeaseInformer = add(coordinationv1.Resource("leases"), leases.Informer, nil); ds.LeaseInformer != nil {
		ds.Leases = leases.Lister().Leases(namespace)
	}

	ds.APITicketLeases = newStore(coordinationv1.Resource("leases"), namespace,
		add(coordinationv1.Resource("leases"), apiTicketFactory.Coordination().V1().Leases().Informer, nil),
		func(ns string) objectClient[*coordinationv1.Lease] {
			return noStatus[*coordinationv1.Lease]{kubeClient.CoordinationV1().Leases(ns)}
		})

	if err != nil {
		return nil, fmt.Errorf("adding cache indexers: %w", err)
	}
	return ds, nil
}

// Start runs every informer until ctx ends.
func (ds *DataStore) Start(ctx context.Context) {
	for _, f := range ds.factories {
		f.Start(ctx.Done())
	}
	for _, run := range ds.runners {
		run(ctx)
	}
}

// WaitForCacheSync blocks until every informer has listed once, or ctx ends.
func (ds *DataStore) WaitForCacheSync(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), ds.synced...) {
		return fmt.Errorf("informer caches did not sync: %w", ctx.Err())
	}
	logrus.WithField("informers", len(ds.synced)).Debug("Informer caches synced")
	return nil
}
