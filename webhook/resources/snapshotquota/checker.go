// Package snapshotquota holds the soft snapshot-space limit of seed
// snapshot-space-management: before a snapshot is taken — a Strata
// Snapshot, a VolumeSnapshot of a Strata claim, a KubeVirt
// VirtualMachineSnapshot or a Harvester VirtualMachineBackup — the request
// is denied when what the namespace's, or a VM's, snapshots hold plus what
// the new snapshots would hold exceeds the namespace's default-resource-quota.
//
// Everything is read from the manager's caches: usage is the per-volume sum
// the datastore keeps from Snapshot events, what a request adds is each
// volume's live head as its engine last reported it.
package snapshotquota

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
)

// Charge is what one request would snapshot.
type Charge struct {
	// What names the request in the denial, for example
	// "VirtualMachineBackup default/b3".
	What string
	// Namespace is the namespace whose quota applies.
	Namespace string
	// Volumes are the Strata volumes the request snapshots.
	Volumes []string
	// VM is the VM a VM-level request snapshots; for other requests the VMs
	// whose claims the volumes serve are checked.
	VM string
}

// Checker judges charges against the namespaces' quotas.
type Checker struct {
	ds *datastore.DataStore
}

// NewChecker returns a Checker over the datastore's caches.
func NewChecker(ds *datastore.DataStore) *Checker { return &Checker{ds: ds} }

// Check returns a PolicyError when the charge would take a VM or the
// namespace over its quota. Absent or zero quotas are unlimited.
// headReadTimeout bounds the live reads of the charged volumes' engines,
// well inside the webhook's 5 s.
const headReadTimeout = 2 * time.Second

func (c *Checker) Check(ch Charge) error {
	rq, ok := c.ds.NamespaceQuota(ch.Namespace)
	if !ok {
		return nil
	}
	limits := rq.Spec.SnapshotLimit
	ctx, cancel := context.WithTimeout(context.Background(), headReadTimeout)
	defer cancel()
	heads := map[string]int64{}
	for _, v := range ch.Volumes {
		heads[v] = c.ds.HeadBytes(ctx, v)
	}
	for _, vm := range c.vmsOf(ch) {
		quota, ok := limits.VMTotalSnapshotSizeQuota[vm]
		if !ok || quota.IsZero() {
			continue
		}
		vmVolumes := c.vmVolumes(ch.Namespace, vm)
		var adds int64
		for _, v := range ch.Volumes {
			if slices.Contains(vmVolumes, v) {
				adds += heads[v]
			}
		}
		usage := c.ds.SnapshotBytesOf(vmVolumes)
		if usage+adds > quota.Value() {
			return deny(ch, fmt.Sprintf("VirtualMachine %s/%s", ch.Namespace, vm), usage, adds, quota,
				fmt.Sprintf("spec.snapshotLimit.vmTotalSnapshotSizeQuota[%s]", vm))
		}
	}
	if quota := limits.NamespaceTotalSnapshotSizeQuota; quota != nil && !quota.IsZero() {
		var adds int64
		for _, n := range heads {
			adds += n
		}
		usage := c.ds.SnapshotBytesOf(c.ds.VolumesInNamespace(ch.Namespace))
		if usage+adds > quota.Value() {
			return deny(ch, "namespace "+ch.Namespace, usage, adds, *quota, "spec.snapshotLimit.namespaceTotalSnapshotSizeQuota")
		}
	}
	return nil
}

// vmsOf are the VMs whose quotas the charge counts against.
func (c *Checker) vmsOf(ch Charge) []string {
	if ch.VM != "" {
		return []string{ch.VM}
	}
	var vms []string
	for _, v := range ch.Volumes {
		claim, ok := c.ds.ClaimOfVolume(v)
		if !ok {
			continue
		}
		for _, vm := range c.ds.OptionalKinds.VirtualMachinesUsing(claim) {
			if !slices.Contains(vms, vm.GetName()) {
				vms = append(vms, vm.GetName())
			}
		}
	}
	return vms
}

func (c *Checker) vmVolumes(namespace, name string) []string {
	vm, ok := c.ds.OptionalKinds.VirtualMachine(namespace, name)
	if !ok {
		return nil
	}
	return c.ds.VirtualMachineVolumes(vm)
}

func deny(ch Charge, scope string, usage, adds int64, quota resource.Quantity, field string) error {
	return admission.Policy("snapshot space quota exceeded: the snapshots of %s hold %s, and %s would add %s (the "+
		"live data of %s), over its quota of %s (ResourceQuota %s/%s %s)",
		scope, size(usage), ch.What, size(adds), volumeList(ch.Volumes), quota.String(),
		ch.Namespace, v1beta1.DefaultResourceQuotaName, field)
}

// size prints bytes in binary units, exact where it can: 30Mi, 1536Ki.
func size(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

func volumeList(volumes []string) string {
	switch len(volumes) {
	case 0:
		return "no Strata volume"
	case 1:
		return "volume " + volumes[0]
	}
	return "volumes " + strings.Join(volumes, ", ")
}
