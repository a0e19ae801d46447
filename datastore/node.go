package datastore

import (
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// LeaseExpiry is when a heartbeat lease runs out: its last renewal plus its
// own duration. A lease without either has never been renewed.
func LeaseExpiry(lease *coordinationv1.Lease) (time.Time, bool) {
	if lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	return lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second), true
}

// NodeLeaseExpiry is when the named node's heartbeat runs out; false when the
// node has no heartbeat lease at all.
func (ds *DataStore) NodeLeaseExpiry(nodeName string) (time.Time, bool) {
	lease, err := ds.Leases.Get(types.NodeLeaseName(nodeName))
	if err != nil {
		return time.Time{}, false
	}
	return LeaseExpiry(lease)
}

// IsNodeAlive is true while the node's manager keeps renewing its lease.
func (ds *DataStore) IsNodeAlive(nodeName string) bool {
	expiry, ok := ds.NodeLeaseExpiry(nodeName)
	return ok && ds.Clock.Now().Before(expiry)
}

// AliveNodeNames lists, sorted, the registered nodes whose managers are alive.
func (ds *DataStore) AliveNodeNames() ([]string, error) {
	nodes, err := ds.Nodes.ListRO(labels.Everything())
	if err != nil {
		return nil, err
	}
	var alive []string
	for _, n := range nodes {
		if ds.IsNodeAlive(n.Name) {
			alive = append(alive, n.Name)
		}
	}
	sort.Strings(alive)
	return alive, nil
}

// DiskLocation is where a disk is: its node, its name there and its path,
// and whether the node reports it ready.
type DiskLocation struct {
	Node, Name, Path string
	Ready            bool
}

// NodeDisks lists a node's disks by UUID. Two entries share a UUID when a
// disk was remounted at another path and added there: the ready one is
// where the disk is.
func NodeDisks(n *v1beta1.Node) map[string]DiskLocation {
	out := map[string]DiskLocation{}
	for name, st := range n.Status.DiskStatus {
		spec, ok := n.Spec.Disks[name]
		if st == nil || st.DiskUUID == "" || !ok {
			continue
		}
		loc := DiskLocation{Node: n.Name, Name: name, Path: spec.Path,
			Ready: meta.IsStatusConditionTrue(st.Conditions, v1beta1.ConditionTypeReady)}
		if prev, dup := out[st.DiskUUID]; !dup || (!prev.Ready && loc.Ready) {
			out[st.DiskUUID] = loc
		}
	}
	return out
}

// LocateDisk finds a disk by UUID through the nodes' disk status; ok is
// false when no node reports it (its node is gone, or its UUID file was not
// read yet).
func (ds *DataStore) LocateDisk(uuid string) (DiskLocation, bool) {
	nodes, err := ds.Nodes.ListByIndexRO(IndexByDisk, uuid)
	if err != nil {
		return DiskLocation{}, false
	}
	var found DiskLocation
	ok := false
	for _, n := range nodes {
		if loc, has := NodeDisks(n)[uuid]; has && (!ok || (!found.Ready && loc.Ready)) {
			found, ok = loc, true
		}
	}
	return found, ok
}
