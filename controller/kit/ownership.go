package kit

import (
	"hash/fnv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ResponsibleNode picks the one node whose manager reconciles an object, the
// way every manager computes it from the same inputs:
//   - the preferred node (say, where a volume is attached) while it is alive;
//   - else the recorded owner (status.ownerID) while it is alive;
//   - else an alive node chosen by rendezvous hashing of the object's key, so
//     orphaned objects spread over the survivors and a node joining or leaving
//     moves only the objects it wins or held.
//
// alive lists the nodes whose managers hold their heartbeat lease. "" means
// no node is alive.
func ResponsibleNode(key, ownerID, preferred string, alive []string) string {
	isAlive := func(n string) bool {
		for _, a := range alive {
			if a == n {
				return true
			}
		}
		return false
	}
	if preferred != "" && isAlive(preferred) {
		return preferred
	}
	if ownerID != "" && isAlive(ownerID) {
		return ownerID
	}
	best, bestScore := "", uint64(0)
	for _, n := range alive {
		h := fnv.New64a()
		_, _ = h.Write([]byte(key))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(n))
		if score := h.Sum64(); best == "" || score > bestScore {
			best, bestScore = n, score
		}
	}
	return best
}

// IsResponsibleFor tells whether this manager reconciles the object with the
// given key, recorded owner and preferred owner.
func (c *BaseController) IsResponsibleFor(key, ownerID, preferred string) (bool, error) {
	alive, err := c.DS.AliveNodeNames()
	if err != nil {
		return false, err
	}
	return ResponsibleNode(key, ownerID, preferred, alive) == c.ControllerID, nil
}

// RequeueOnNodeReadyChange re-enqueues every object a controller reconciles
// (enqueueAll) whenever some node's Ready condition flips or a node goes
// away: that is when the responsible node of an object can change. Objects
// first seen while no node was alive (at cluster start) are picked up this
// way once their owner's manager comes up. Renewals change nothing here.
func (c *BaseController) RequeueOnNodeReadyChange(enqueueAll func()) error {
	_, err := c.DS.Nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: OnUpdate(func(o, n *v1beta1.Node) {
			if readyFlipped(o, n) {
				enqueueAll()
			}
		}),
		// Untyped: any delete moves ownership, whatever its tombstone holds.
		DeleteFunc: func(any) { enqueueAll() },
	})
	return err
}

// readyFlipped tells a Node update whose Ready condition changed status:
// the only update that can move ownership. Pure, so it is table-tested.
func readyFlipped(o, n *v1beta1.Node) bool {
	return readyStatus(o) != readyStatus(n)
}

func readyStatus(n *v1beta1.Node) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(n.Status.Conditions, v1beta1.ConditionTypeReady); c != nil {
		return c.Status
	}
	return metav1.ConditionUnknown
}

// GetResponsible reads the object of a queue key from the cache and says
// whether this manager reconciles it: its instance's node when that node is
// alive, else its recorded owner, else the hashing fallback. A missing
// object (deleted) or another node's object yields ok=false.
func GetResponsible[T datastore.Object](c *BaseController, store *datastore.Store[T], key string,
	ownerAndNode func(T) (ownerID, nodeID string)) (obj T, ok bool, err error) {
	name, err := NameFromKey(key)
	if err != nil {
		return obj, false, err
	}
	obj, err = store.GetRO(name)
	if apierrors.IsNotFound(err) {
		return obj, false, nil
	}
	if err != nil {
		return obj, false, err
	}
	owner, node := ownerAndNode(obj)
	ok, err = c.IsResponsibleFor(key, owner, node)
	return obj, ok, err
}
