package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Event reasons of orphan cleanup.
const (
	EventReasonOrphanedDataDeleted     = "OrphanedDataDeleted"
	EventReasonOrphanedInstanceStopped = "OrphanedInstanceStopped"
)

// replicasDir is the directory of a disk that holds one directory per replica.
func replicasDir(diskPath string) string { return filepath.Join(diskPath, "replicas") }

// orphanedDirectories lists the replica directories on a disk that no
// Replica names: their replica went while the data plane could not delete
// them (node or instance manager down). The rule is the one the deletion
// checks against the API server — any replica, of any node — so a
// directory is never listed that cleanup would keep. Sorted, so the status
// is stable.
func (nc *NodeController) orphanedDirectories(diskPath string) []string {
	entries, err := os.ReadDir(replicasDir(diskPath))
	if err != nil || len(entries) == 0 {
		return nil
	}
	var orphans []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		// The instance manager creates a directory only for a replica this
		// manager's cache holds, so one the cache lacks has gone.
		if named, err := nc.DS.Replicas.ListByIndexRO(datastore.IndexByDataDirectory, e.Name()); err == nil && len(named) == 0 {
			orphans = append(orphans, e.Name())
		}
	}
	slices.Sort(orphans)
	return orphans
}

// cleanupOrphans stops instances no Engine or Replica names any more and
// deletes the orphaned directories the node's status lists. It acts only on
// a live view of the instance manager, and confirms each orphan against the
// API server rather than the cache before deleting anything.
func (nc *NodeController) cleanupOrphans(ctx context.Context, node *v1beta1.Node) error {
	if nc.instances == nil || !nc.instances.Synced() {
		return nil // the instance cache's sync enqueues the node again
	}
	stale := nc.staleInstances()
	orphans := map[string]string{} // path -> disk name
	if autoDelete, err := nc.DS.GetSettingBool(types.SettingOrphanedDataAutoDeletion); err == nil && autoDelete {
		for name, st := range node.Status.DiskStatus {
			spec, ok := node.Spec.Disks[name]
			if !ok || !meta.IsStatusConditionTrue(st.Conditions, v1beta1.ConditionTypeReady) {
				continue // the path may not be this disk now
			}
			for _, dir := range st.OrphanedReplicaDirectories {
				orphans[filepath.Join(replicasDir(spec.Path), dir)] = name
			}
		}
	}
	if len(stale) == 0 && len(orphans) == 0 {
		return nil
	}
	client, err := nc.imClient()
	if err != nil {
		return err
	}
	var errs []error
	for _, inst := range stale {
		errs = append(errs, nc.stopStaleInstance(ctx, client, node, inst))
	}
	if len(orphans) > 0 {
		live, err := nc.liveDirectories(ctx, node.Name)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		deleted := 0
		for _, path := range slices.Sorted(maps.Keys(orphans)) {
			if live[filepath.Base(path)] {
				continue // named again meanwhile: not an orphan
			}
			if err := client.ReplicaDataDelete(ctx, path); err != nil {
				errs = append(errs, fmt.Errorf("deleting orphaned replica data %s: %w", path, err))
				continue
			}
			deleted++
			nc.Logger.WithField("path", path).Info("Deleted orphaned replica data")
			nc.Recorder.Eventf(node, corev1.EventTypeNormal, EventReasonOrphanedDataDeleted,
				"deleted orphaned replica data %s on disk %s: no replica names it", path, orphans[path])
		}
		if deleted > 0 {
			// The status drops them at once rather than at the next disk
			// check. Only after progress: a directory that cannot go is
			// retried with the queue's backoff, not in a loop.
			nc.Queue.Add(nc.DS.Namespace + "/" + nc.ControllerID)
		}
	}
	return errors.Join(errs...)
}

// staleInstances are the instances the cache knows whose Engine or Replica
// is not in the cache: left running when their CR went while the instance
// manager was unreachable, or reopened from disk by a restarted one.
func (nc *NodeController) staleInstances() []*engineapi.Instance {
	var stale []*engineapi.Instance
	for _, inst := range nc.instances.List() {
		var err error
		switch inst.Type {
		case engineapi.InstanceTypeReplica:
			_, err = nc.DS.Replicas.GetRO(inst.Name)
		case engineapi.InstanceTypeEngine:
			_, err = nc.DS.Engines.GetRO(inst.Name)
		default:
			continue
		}
		if apierrors.IsNotFound(err) {
			stale = append(stale, inst)
		}
	}
	return stale
}

// stopStaleInstance deletes an instance once the API server confirms its
// CR is gone (the cache may lag behind a create).
func (nc *NodeController) stopStaleInstance(ctx context.Context, client engineapi.DataPlane, node *v1beta1.Node, inst *engineapi.Instance) error {
	var err error
	if inst.Type == engineapi.InstanceTypeReplica {
		_, err = nc.DS.Replicas.GetLive(ctx, inst.Name)
	} else {
		_, err = nc.DS.Engines.GetLive(ctx, inst.Name)
	}
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	if err := client.InstanceDelete(ctx, inst.Name); err != nil && !errors.Is(err, engineapi.ErrNotFound) {
		return fmt.Errorf("stopping orphaned instance %s: %w", inst.Name, err)
	}
	nc.Logger.WithField("instance", inst.Name).Info("Stopped an instance whose Engine or Replica is gone")
	nc.Recorder.Eventf(node, corev1.EventTypeNormal, EventReasonOrphanedInstanceStopped,
		"stopped instance %s: its %s is gone", inst.Name, instanceKind(inst))
	return nil
}

func instanceKind(inst *engineapi.Instance) string {
	if inst.Type == engineapi.InstanceTypeReplica {
		return "Replica"
	}
	return "Engine"
}

// liveDirectories lists, from the API server, the data directories the
// node's replicas name: deleting data is the one step that must not trust a
// cache that could be behind.
func (nc *NodeController) liveDirectories(ctx context.Context, nodeName string) (map[string]bool, error) {
	// Every replica, not only those labelled with this node: a directory
	// any replica names is never an orphan.
	list, err := nc.DS.StrataClient.StrataV1beta1().Replicas(nc.DS.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing replicas to confirm orphans on node %s: %w", nodeName, err)
	}
	live := map[string]bool{}
	for _, r := range list.Items {
		if r.Spec.DataDirectoryName != "" {
			live[r.Spec.DataDirectoryName] = true
		}
	}
	return live, nil
}
