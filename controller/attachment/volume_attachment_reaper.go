package attachment

// The ticket reaper: a ticket may name its owner (a Snapshot, a Backup, a
// Kubernetes VolumeAttachment, a Volume being cloned, the Lease of a REST
// API client). Once the owner is gone, or replaced by an object of the same
// name with another UID, or, for a Lease, no longer renewed, the ticket goes
// too, so an interrupted operation or a vanished client never leaves a
// volume attached. The AD sync drops such tickets before it decides anything.

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Ticket status condition the reaper sets on a ticket whose owner it cannot
// watch.
const (
	TicketConditionTypeOwnerWatched = "OwnerWatched"
	TicketReasonOwnerKindNotWatched = "OwnerKindNotWatched"
)

// The owner kinds the reaper watches.
var (
	gkSnapshot                = v1beta1.SchemeGroupVersion.WithKind("Snapshot").GroupKind()
	gkBackup                  = v1beta1.SchemeGroupVersion.WithKind("Backup").GroupKind()
	gkVolume                  = v1beta1.SchemeGroupVersion.WithKind("Volume").GroupKind()
	gkBackingImage            = v1beta1.SchemeGroupVersion.WithKind("BackingImage").GroupKind()
	gkSnapshotGroup           = v1beta1.SchemeGroupVersion.WithKind("SnapshotGroup").GroupKind()
	gkStorageVolumeAttachment = storagev1.SchemeGroupVersion.WithKind("VolumeAttachment").GroupKind()
	gkLease                   = coordinationv1.SchemeGroupVersion.WithKind("Lease").GroupKind()
)

// ownerLookup reads an owner from the cache and, to rule out a cache that
// lags behind, from the API server.
type ownerLookup struct {
	cached func(namespace, name string) (metav1.Object, error)
	live   func(ctx context.Context, namespace, name string) (metav1.Object, error)
	// namespaced kinds default an empty namespace in the reference to the
	// manager's namespace.
	namespaced bool
}

func cachedOwner[T datastore.Object](s *datastore.Store[T]) func(namespace, name string) (metav1.Object, error) {
	return func(namespace, name string) (metav1.Object, error) {
		obj, err := s.GetInNamespaceRO(namespace, name)
		if err != nil {
			return nil, err
		}
		return obj, nil
	}
}

func liveOwner[T metav1.Object](get func(ctx context.Context, namespace, name string) (T, error)) func(
	ctx context.Context, namespace, name string) (metav1.Object, error) {
	return func(ctx context.Context, namespace, name string) (metav1.Object, error) {
		obj, err := get(ctx, namespace, name)
		if err != nil {
			return nil, err
		}
		return obj, nil
	}
}

func (c *VolumeAttachmentController) ownerLookups() map[schema.GroupKind]ownerLookup {
	strata, kube := c.DS.StrataClient.StrataV1beta1(), c.DS.KubeClient.StorageV1()
	return map[schema.GroupKind]ownerLookup{
		gkSnapshot: {cachedOwner(c.DS.Snapshots), liveOwner(func(ctx context.Context, ns, name string) (*v1beta1.Snapshot, error) {
			return strata.Snapshots(ns).Get(ctx, name, metav1.GetOptions{})
		}), true},
		gkBackup: {cachedOwner(c.DS.Backups), liveOwner(func(ctx context.Context, ns, name string) (*v1beta1.Backup, error) {
			return strata.Backups(ns).Get(ctx, name, metav1.GetOptions{})
		}), true},
		gkVolume: {cachedOwner(c.DS.Volumes), liveOwner(func(ctx context.Context, ns, name string) (*v1beta1.Volume, error) {
			return strata.Volumes(ns).Get(ctx, name, metav1.GetOptions{})
		}), true},
		gkBackingImage: {cachedOwner(c.DS.BackingImages), liveOwner(func(ctx context.Context, ns, name string) (*v1beta1.BackingImage, error) {
			return strata.BackingImages(ns).Get(ctx, name, metav1.GetOptions{})
		}), true},
		gkSnapshotGroup: {cachedOwner(c.DS.SnapshotGroups), liveOwner(func(ctx context.Context, ns, name string) (*v1beta1.SnapshotGroup, error) {
			return strata.SnapshotGroups(ns).Get(ctx, name, metav1.GetOptions{})
		}), true},
		gkLease: {cachedOwner(c.DS.APITicketLeases), liveOwner(func(ctx context.Context, ns, name string) (*coordinationv1.Lease, error) {
			return c.DS.KubeClient.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		}), true},
		gkStorageVolumeAttachment: {cachedOwner(c.DS.StorageVolumeAttachments),
			liveOwner(func(ctx context.Context, _, name string) (*storagev1.VolumeAttachment, error) {
				return kube.VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
			}), false},
	}
}

// ownerVerdict is what the reaper found out about a ticket's owner.
type ownerVerdict int

const (
	ownerPresent ownerVerdict = iota
	ownerGone
	ownerNotWatched
)

// ticketOwnerVerdict tells whether a ticket's owner still exists. The cache
// answers when the owner is there; "gone" is confirmed with the API server,
// because a ticket may reach this manager before its freshly created owner
// does. detail says why the owner is gone.
func (c *VolumeAttachmentController) ticketOwnerVerdict(ctx context.Context,
	ref *v1beta1.TicketOwnerReference) (verdict ownerVerdict, detail string, err error) {
	lookup, ok := c.lookups[datastore.TicketOwnerGroupKind(ref)]
	if !ok {
		return ownerNotWatched, "", nil
	}
	ns := ref.Namespace
	if !lookup.namespaced {
		ns = ""
	} else if ns == "" {
		ns = c.DS.Namespace
	}
	matches := func(obj metav1.Object) bool { return ref.UID == "" || obj.GetUID() == k8stypes.UID(ref.UID) }

	if obj, err := lookup.cached(ns, ref.Name); err == nil && matches(obj) {
		if verdict, _, _ := c.presentUnlessLapsed(obj); verdict == ownerPresent {
			return ownerPresent, "", nil
		}
		// Lapsed in the cache: its renewal may not have reached it yet.
	} else if err != nil && !apierrors.IsNotFound(err) {
		return ownerPresent, "", err
	}
	obj, err := lookup.live(ctx, ns, ref.Name)
	switch {
	case apierrors.IsNotFound(err):
		return ownerGone, "it no longer exists", nil
	case err != nil:
		return ownerPresent, "", err
	case !matches(obj):
		return ownerGone, fmt.Sprintf("it was replaced (UID %s, the ticket names %s)", obj.GetUID(), ref.UID), nil
	}
	return c.presentUnlessLapsed(obj)
}

// presentUnlessLapsed: an owner that exists is present, unless it is a
// Lease its holder stopped renewing.
func (c *VolumeAttachmentController) presentUnlessLapsed(obj metav1.Object) (ownerVerdict, string, error) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return ownerPresent, "", nil
	}
	if end := leaseEnd(l); !end.IsZero() && !c.DS.Clock.Now().Before(end) {
		return ownerGone, fmt.Sprintf("its holder %q stopped renewing it (it lapsed at %s)",
			ptr.Deref(l.Spec.HolderIdentity, ""), end.UTC().Format(time.RFC3339)), nil
	}
	return ownerPresent, "", nil
}

// leaseEnd is when a Lease lapses unless renewed: its renew (or acquire)
// time plus its duration; zero for a Lease that says neither.
func leaseEnd(l *coordinationv1.Lease) time.Time {
	renewed := l.Spec.RenewTime
	if renewed == nil {
		renewed = l.Spec.AcquireTime
	}
	if renewed == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return renewed.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

// requeueAtLapse looks at the VolumeAttachment again when the Lease owning
// one of its tickets would lapse: a lapse is no event.
func (c *VolumeAttachmentController) requeueAtLapse(va *v1beta1.VolumeAttachment, ref *v1beta1.TicketOwnerReference) {
	if datastore.TicketOwnerGroupKind(ref) != gkLease {
		return
	}
	l, err := c.DS.APITicketLeases.GetInNamespaceRO(cmp.Or(ref.Namespace, c.DS.Namespace), ref.Name)
	if err != nil {
		return
	}
	if end := leaseEnd(l); !end.IsZero() {
		c.Queue.AddAfter(va.Namespace+"/"+va.Name, end.Sub(c.DS.Clock.Now())+time.Second)
	}
}

// deleteLapsedLease removes the Lease of a ticket reaped because it lapsed
// (a Lease the holder deleted is gone already).
func (c *VolumeAttachmentController) deleteLapsedLease(ctx context.Context, ref *v1beta1.TicketOwnerReference) {
	if datastore.TicketOwnerGroupKind(ref) != gkLease {
		return
	}
	if _, err := c.DS.APITicketLeases.DeleteIfUID(ctx, ref.Name, k8stypes.UID(ref.UID)); err != nil && !apierrors.IsNotFound(err) {
		c.Logger.WithError(err).WithField("lease", ref.Name).Warn("Cannot delete a lapsed API ticket Lease")
	}
}

// reapTickets removes the tickets whose owners are gone, writing the
// VolumeAttachment once, and returns it as it now is together with the
// tickets whose owner kind is not watched (ticket ID -> owner kind). A
// conflict is returned: the key is retried with a fresh copy.
func (c *VolumeAttachmentController) reapTickets(ctx context.Context,
	va *v1beta1.VolumeAttachment) (*v1beta1.VolumeAttachment, map[string]string, error) {
	type reaped struct {
		id    string
		owner *v1beta1.TicketOwnerReference
		msg   string
	}
	var gone []reaped
	unwatched := map[string]string{}
	for _, id := range slices.Sorted(maps.Keys(va.Spec.AttachmentTickets)) {
		t := va.Spec.AttachmentTickets[id]
		if t == nil || t.OwnerRef == nil {
			continue
		}
		verdict, detail, err := c.ticketOwnerVerdict(ctx, t.OwnerRef)
		if err != nil {
			return va, nil, fmt.Errorf("checking the owner of ticket %s: %w", id, err)
		}
		switch verdict {
		case ownerPresent:
			c.requeueAtLapse(va, t.OwnerRef)
		case ownerGone:
			gone = append(gone, reaped{id, t.OwnerRef, fmt.Sprintf("removed ticket %s (%s, node %s): its owner %s %s is gone: %s",
				id, t.Type, t.NodeID, describeOwner(t.OwnerRef), ownerName(t.OwnerRef), detail)})
		case ownerNotWatched:
			gk := datastore.TicketOwnerGroupKind(t.OwnerRef).String()
			unwatched[id] = gk
			if _, logged := c.unwatchedKindsLogged.LoadOrStore(gk, true); !logged {
				c.Logger.WithFields(map[string]interface{}{"volumeAttachment": va.Name, "ticket": id, "ownerKind": gk}).
					Warn("Ticket owner kind is not watched; such tickets are never removed when their owner goes")
			}
		}
	}
	if len(gone) == 0 {
		return va, unwatched, nil
	}
	cp := va.DeepCopy()
	for _, g := range gone {
		delete(cp.Spec.AttachmentTickets, g.id)
	}
	updated, err := c.DS.VolumeAttachments.Update(ctx, cp)
	if err != nil {
		return va, nil, err
	}
	for _, g := range gone {
		c.deleteLapsedLease(ctx, g.owner)
		c.Logger.WithField("volumeAttachment", va.Name).Info(g.msg)
		c.Recorder.Event(updated, corev1.EventTypeNormal, EventReasonADTicketRemoved, g.msg)
	}
	return updated, unwatched, nil
}

func describeOwner(ref *v1beta1.TicketOwnerReference) string {
	return datastore.TicketOwnerGroupKind(ref).String()
}

func ownerName(ref *v1beta1.TicketOwnerReference) string {
	if ref.Namespace != "" {
		return ref.Namespace + "/" + ref.Name
	}
	return ref.Name
}

// markUnwatchedOwners sets the OwnerWatched condition of tickets whose
// owner kind is not watched, and drops it from every other ticket.
func markUnwatchedOwners(statuses map[string]*v1beta1.AttachmentTicketStatus, unwatched map[string]string, now metav1.Time) {
	for id, st := range statuses {
		if gk, ok := unwatched[id]; ok {
			kit.SetCondition(&st.Conditions, TicketConditionTypeOwnerWatched, false, TicketReasonOwnerKindNotWatched,
				fmt.Sprintf("owners of kind %s are not watched: the ticket stays until its creator removes it", gk), now)
			continue
		}
		removeCondition(&st.Conditions, TicketConditionTypeOwnerWatched)
	}
}

func removeCondition(conds *[]metav1.Condition, condType string) {
	out := (*conds)[:0]
	for _, c := range *conds {
		if c.Type != condType {
			out = append(out, c)
		}
	}
	*conds = out
}

// enqueueTicketsOwnedBy enqueues exactly the VolumeAttachments holding a
// ticket owned by m (through IndexByTicketOwner), for m of kind gk that
// was deleted or replaced.
func (c *VolumeAttachmentController) enqueueTicketsOwnedBy(gk schema.GroupKind, m metav1.Object) {
	vas, err := c.DS.VolumeAttachments.ListByIndexRO(datastore.IndexByTicketOwner,
		datastore.TicketOwnerKey(gk, m.GetNamespace(), m.GetName()))
	if err != nil {
		c.Logger.WithError(err).Warn("Cannot look up the tickets of a deleted owner")
		return
	}
	for _, va := range vas {
		c.Enqueue(va)
	}
}

// ownerHandlers enqueues the tickets of an owner of kind gk when it is
// deleted, or replaced by a new object of the same name (a relist may show
// that as an update with a new UID).
func (c *VolumeAttachmentController) ownerHandlers(gk schema.GroupKind) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n metav1.Object) {
			if o.GetUID() != n.GetUID() {
				c.enqueueTicketsOwnedBy(gk, o)
			}
		}),
		DeleteFunc: kit.OnDelete(func(m metav1.Object) { c.enqueueTicketsOwnedBy(gk, m) }),
	}
}
