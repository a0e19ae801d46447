package node

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// leaseCheckSlack is added to a peer's lease expiry before it is re-checked,
// so a renewal that lands right at the deadline is seen.
const leaseCheckSlack = time.Second

// DefaultFreeSpaceReportInterval is how often, at most, a change of a
// disk's free space alone is written to its Node (--free-space-report-interval).
const DefaultFreeSpaceReportInterval = 5 * time.Minute

// NodeControllerOptions tune the node controller; zero values take defaults.
type NodeControllerOptions struct {
	// LeaseDuration is how long this manager's heartbeat lease is valid;
	// peers mark the node down once it has not been renewed for this long.
	LeaseDuration time.Duration
	// DiskCheckInterval is how often this node's disks are inspected.
	DiskCheckInterval time.Duration
	// FreeSpaceReportInterval is the least time between two Node writes
	// that report nothing but moved free space (see checkDisks).
	FreeSpaceReportInterval time.Duration
	// Instances is this node's instance cache and IMAddress its instance
	// manager; with them the controller stops orphaned instances and
	// deletes orphaned replica data (node_orphans.go). Nil: no data plane.
	Instances *kit.InstanceCache
	IMAddress string
	DataPlane engineapi.Connector
	// APIAddress is where this manager's HTTP API is reachable by peers;
	// published in the node's status.
	APIAddress string
}

// NodeController registers this manager's node and keeps its status (disks,
// Ready), keeps its heartbeat lease, and marks peer nodes down when their
// leases run out.
type NodeController struct {
	*kit.BaseController
	disks             []DiskConfig
	leaseDuration     time.Duration
	diskCheckInterval time.Duration
	heartbeat         lease.Controller
	heartbeatOnce     sync.Once
	instances         *kit.InstanceCache
	imClient          func() (engineapi.DataPlane, error)
	apiAddress        string

	// freeSpaceReportInterval and lastDiskEnqueue pace checkDisks;
	// lastDiskEnqueue is only touched by checkDisks, which runs alone.
	freeSpaceReportInterval time.Duration
	lastDiskEnqueue         time.Time

	peerMu     sync.Mutex
	peerTimers map[string]*time.Timer
}

// checkPeerAt looks at a peer's heartbeat again after d, outside the
// workqueue: a lease renewed meanwhile (the normal case) just moves the
// timer, and only an expired one enqueues the node. A quiet cluster's
// queues stay quiet.
func (nc *NodeController) checkPeerAt(key, node string, d time.Duration) {
	nc.peerMu.Lock()
	defer nc.peerMu.Unlock()
	if nc.peerTimers == nil {
		nc.peerTimers = map[string]*time.Timer{}
	}
	if t, ok := nc.peerTimers[key]; ok {
		t.Stop()
	}
	nc.peerTimers[key] = time.AfterFunc(d, func() {
		if deadline, ok := nc.DS.NodeLeaseExpiry(node); ok {
			if now := nc.DS.Clock.Now(); now.Before(deadline) {
				nc.checkPeerAt(key, node, deadline.Sub(now)+leaseCheckSlack)
				return
			}
		}
		nc.Queue.Add(key)
	})
}

// NewNodeController wires the node controller to the datastore's Node and
// Lease informers.
func NewNodeController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string, disks []DiskConfig, opts NodeControllerOptions) (*NodeController, error) {
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 20 * time.Second
	}
	if opts.DiskCheckInterval <= 0 {
		opts.DiskCheckInterval = 30 * time.Second
	}
	if opts.FreeSpaceReportInterval <= 0 {
		opts.FreeSpaceReportInterval = DefaultFreeSpaceReportInterval
	}
	nc := &NodeController{
		BaseController:          kit.NewBaseController("strata-node", controllerID, logger, ds, recorder),
		disks:                   disks,
		leaseDuration:           opts.LeaseDuration,
		diskCheckInterval:       opts.DiskCheckInterval,
		freeSpaceReportInterval: opts.FreeSpaceReportInterval,
		instances:               opts.Instances,
		apiAddress:              opts.APIAddress,
		imClient:                func() (engineapi.DataPlane, error) { return opts.DataPlane.DataPlane(opts.IMAddress) },
	}
	nc.Sync = nc.syncNode
	if nc.instances != nil {
		// A live view again: orphans left while it was lost can go now.
		nc.instances.OnSynced(func() { nc.Queue.Add(ds.Namespace + "/" + controllerID) })
	}
	leaseSeconds := int32(opts.LeaseDuration.Round(time.Second) / time.Second)
	// Renew four times per lease duration, as the kubelet does, so one or two
	// slow renewals do not make the node look down.
	nc.heartbeat = lease.NewController(clock.RealClock{}, ds.KubeClient, controllerID, max(leaseSeconds, 1),
		func() { nc.Logger.Warn("Heartbeat lease renewals keep failing") },
		opts.LeaseDuration/4, types.NodeLeaseName(controllerID), ds.Namespace, labelNodeLease(controllerID))

	if _, err := ds.Nodes.Informer().AddEventHandler(nc.EnqueueOnChange()); err != nil {
		return nil, err
	}
	// The disks' scheduledReplica lists follow the replicas placed here, as
	// they are placed, moved or resized, not at the next disk check (which
	// would write them in an otherwise quiet minute). A replica of this node
	// that goes may also leave its data behind (its instance manager was
	// unreachable): report it as orphaned now. Placements come in bursts
	// (a thousand volumes created at once), so they are gathered into one
	// write per placementBatch.
	if _, err := ds.Replicas.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(r *v1beta1.Replica) {
			if r.Spec.NodeID == controllerID {
				nc.Queue.AddAfter(ds.Namespace+"/"+controllerID, placementBatch)
			}
		}),
		UpdateFunc: kit.OnUpdate(func(old, cur *v1beta1.Replica) {
			if (old.Spec.NodeID == controllerID || cur.Spec.NodeID == controllerID) && placementChanged(old, cur) {
				nc.Queue.AddAfter(ds.Namespace+"/"+controllerID, placementBatch)
			}
		}),
		DeleteFunc: kit.OnDelete(func(r *v1beta1.Replica) {
			if r.Spec.NodeID == controllerID {
				nc.Queue.Add(ds.Namespace + "/" + controllerID)
			}
		}),
	}); err != nil {
		return nil, err
	}
	if _, err := ds.LeaseInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    kit.OnAdd(nc.enqueueLeaseNode),
		UpdateFunc: kit.OnUpdate(nc.onLeaseUpdate),
		DeleteFunc: kit.OnDelete(nc.enqueueLeaseNode),
	}); err != nil {
		return nil, err
	}
	// The disks' schedulability is judged against a setting: a change of it
	// shows at once, not at the next disk check.
	if _, err := ds.Settings.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Setting) {
			if n.Name == string(types.SettingStorageMinimalAvailablePercentage) && o.Value != n.Value {
				nc.Queue.Add(ds.Namespace + "/" + nc.ControllerID)
			}
		}),
	}); err != nil {
		return nil, err
	}
	return nc, nil
}

// placementBatch gathers the replica placements of a burst into one Node
// status write.
const placementBatch = time.Second

// placementChanged says whether a replica update changes what a disk's
// status lists: where the replica is, or the size it reserves.
func placementChanged(old, cur *v1beta1.Replica) bool {
	return old.Spec.NodeID != cur.Spec.NodeID || old.Spec.DiskID != cur.Spec.DiskID ||
		old.Spec.VolumeSize != cur.Spec.VolumeSize
}

// labelNodeLease marks the heartbeat lease so the datastore's lease informer,
// which lists only heartbeat leases, sees it.
func labelNodeLease(nodeName string) lease.ProcessLeaseFunc {
	return func(l *coordinationv1.Lease) error {
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[types.LabelComponent] = types.ComponentNodeLease
		l.Labels[types.LabelNode] = nodeName
		return nil
	}
}

// StartHeartbeat begins renewing this manager's heartbeat lease, once. The
// daemon calls it before its caches sync: at scale the first list takes
// longer than a lease, and a restarting manager whose lease ran out
// meanwhile would see its peers take its node's objects (its engines
// "unknown", their volumes "attaching") only to hand them back seconds
// later. A live process keeps them; its workers catch up once synced.
func (nc *NodeController) StartHeartbeat(ctx context.Context) {
	nc.heartbeatOnce.Do(func() { go nc.heartbeat.Run(ctx) })
}

// Run registers the node, starts the heartbeat (if the daemon has not) and
// the disk monitor, and runs the workers until ctx ends.
func (nc *NodeController) Run(ctx context.Context, workers int) {
	nc.StartHeartbeat(ctx)
	go wait.UntilWithContext(ctx, nc.checkDisks, nc.diskCheckInterval)
	nc.Queue.Add(nc.DS.Namespace + "/" + nc.ControllerID)
	nc.BaseController.Run(ctx, workers)
}

// enqueueLeaseNode enqueues the node a heartbeat lease belongs to: a new
// lease starts the expiry watch, a deleted one means the node is down.
func (nc *NodeController) enqueueLeaseNode(l *coordinationv1.Lease) {
	node := l.Labels[types.LabelNode]
	if node == "" {
		node = strings.TrimPrefix(l.Name, types.NodeLeaseName(""))
	}
	nc.Queue.Add(nc.DS.Namespace + "/" + node)
}

// onLeaseUpdate ignores plain renewals: the node's expiry check is already
// scheduled and reads the newest lease when it fires. Only a lease that was
// expired and is renewed again, or that changed hands, needs a look now.
func (nc *NodeController) onLeaseUpdate(oldLease, newLease *coordinationv1.Lease) {
	expiry, ok := datastore.LeaseExpiry(oldLease)
	wasExpired := !ok || !nc.DS.Clock.Now().Before(expiry)
	if wasExpired || ptr.Deref(oldLease.Spec.HolderIdentity, "") != ptr.Deref(newLease.Spec.HolderIdentity, "") {
		nc.enqueueLeaseNode(newLease)
	}
}

// checkDisks enqueues this node only when its disks' status would change,
// so an idle node costs no queue traffic and no writes.
//
// A change of free space alone is enqueued at most once per
// freeSpaceReportInterval: on a disk shared with other work (logs, etcd,
// other tenants) the free space moves past stableAvailable's threshold every
// few minutes, and each write costs an add on every manager's queue. A
// disk crossing the minimal-available percentage flips its Schedulable
// condition, which is enqueued at once like any other change; only the
// figure itself (which the scheduler also reads for a rebuild's data) may
// be up to one interval old. A sync for another reason writes the fresh
// figure anyway, after which there is nothing left here to report.
func (nc *NodeController) checkDisks(context.Context) {
	node, err := nc.DS.Nodes.GetRO(nc.ControllerID)
	if err != nil {
		return
	}
	minAvailablePct, err := nc.DS.GetSettingInt(types.SettingStorageMinimalAvailablePercentage)
	if err != nil {
		nc.Logger.WithError(err).Warn("Cannot check disks")
		return
	}
	cp := node.DeepCopy()
	now := nc.DS.Clock.Now()
	fresh := nc.diskStatuses(cp, minAvailablePct, metav1.NewTime(now))
	if equality.Semantic.DeepEqual(fresh, node.Status.DiskStatus) {
		return
	}
	if onlyFreeSpaceMoved(node.Status.DiskStatus, fresh) && now.Sub(nc.lastDiskEnqueue) < nc.freeSpaceReportInterval {
		nc.Logger.WithField("nextReport", nc.lastDiskEnqueue.Add(nc.freeSpaceReportInterval).Format(time.RFC3339)).
			Debug("Free space moved; reported at the next free-space report")
		return
	}
	nc.lastDiskEnqueue = now
	nc.Queue.Add(nc.DS.Namespace + "/" + nc.ControllerID)
}
