package api

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Volumes and, as actions on a volume, the snapshot CR actions of the
// snapshot-crd seed.
func volumeRoutes() []route {
	return []route{
		{method: http.MethodGet, path: "/v1/volumes", serve: volumes.list},
		{method: http.MethodPost, path: "/v1/volumes", serve: (*call).createVolume},
		{method: http.MethodGet, path: "/v1/volumes/{name}", serve: volumes.get},
		{method: http.MethodDelete, path: "/v1/volumes/{name}", serve: volumes.delete},
		{method: http.MethodPost, path: "/v1/volumes/{name}", actions: map[string]func(*call) error{
			"attach":           (*call).attachVolume,
			"detach":           (*call).detachVolume,
			"expand":           (*call).expandVolume,
			"revert":           (*call).revertVolume,
			"snapshotCRCreate": (*call).createSnapshot,
			"snapshotCRList":   (*call).listSnapshots,
			"snapshotCRGet":    (*call).getSnapshot,
			"snapshotCRDelete": (*call).deleteSnapshot,
			"snapshotBlocks":   (*call).snapshotBlocks,
		}},
	}
}

// list is the body of a list: the objects as their CRs.
type list[T any] struct {
	Items []T `json:"items"`
}

// volumeRequest is the body of a volume create.
type volumeRequest struct {
	Name             string `json:"name"`
	Size             string `json:"size"`
	NumberOfReplicas int32  `json:"numberOfReplicas"`
	BackingImage     string `json:"backingImage"`
	FromBackup       string `json:"fromBackup"`
	DataSource       string `json:"dataSource"`
}

func (req volumeRequest) volume(namespace string) (*v1beta1.Volume, error) {
	if err := checkName(req.Name, true); err != nil {
		return nil, err
	}
	size, err := parseQuantity("size", req.Size, "1Gi", false)
	if err != nil {
		return nil, err
	}
	if req.NumberOfReplicas < 0 {
		return nil, badInput("numberOfReplicas", "%d is negative", req.NumberOfReplicas)
	}
	return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: namespace},
		Spec: v1beta1.VolumeSpec{Size: size, NumberOfReplicas: req.NumberOfReplicas, Frontend: v1beta1.VolumeFrontendNBD,
			BackingImage: req.BackingImage, FromBackup: req.FromBackup, DataSource: req.DataSource}}, nil
}

func (c *call) createVolume() error {
	var req volumeRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	v, err := req.volume(c.opts.Namespace)
	if err != nil {
		return err
	}
	return volumes.create(c, v)
}

// expandRequest is the body of expand.
type expandRequest struct {
	Size string `json:"size"`
}

func (c *call) expandVolume() error {
	name := c.r.PathValue("name")
	var req expandRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	size, err := parseQuantity("size", req.Size, "1Gi", false)
	if err != nil {
		return err
	}
	if err := c.authorize("update", "volumes", c.opts.Namespace, name); err != nil {
		return err
	}
	strata, err := c.strata()
	if err != nil {
		return err
	}
	volumes := strata.StrataV1beta1().Volumes(c.opts.Namespace)
	var updated *v1beta1.Volume
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := volumes.Get(c.ctx(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cmp := size.Cmp(v.Spec.Size); cmp < 0 {
			return badInput("size", "%s is smaller than the volume's %s: volumes only grow", size.String(), v.Spec.Size.String())
		} else if cmp == 0 {
			updated = v
			return nil
		}
		v.Spec.Size = size
		c.stamp(v)
		if updated, err = volumes.Update(c.ctx(), v, metav1.UpdateOptions{}); err == nil {
			c.wrote(updated, name, "expanded to "+size.String())
		}
		return err
	})
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, updated)
}

// snapshotRequest names a snapshot of the volume (and, to create one, its
// labels; an empty name is generated).
type snapshotRequest struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

func (c *call) createSnapshot() error {
	volume := c.r.PathValue("name")
	var req snapshotRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	if err := checkName(req.Name, false); err != nil {
		return err
	}
	if err := c.authorize("create", "snapshots", c.opts.Namespace, req.Name); err != nil {
		return err
	}
	if _, err := volumes.cached(c, volume); err != nil {
		return err
	}
	strata, err := c.strata()
	if err != nil {
		return err
	}
	snap := &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: c.opts.Namespace},
		Spec: v1beta1.SnapshotSpec{Volume: volume, CreateSnapshot: true, Labels: req.Labels}}
	if req.Name == "" {
		snap.GenerateName = "snapshot-"
	}
	c.stamp(snap)
	created, err := strata.StrataV1beta1().Snapshots(c.opts.Namespace).Create(c.ctx(), snap, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	c.wrote(created, created.Name, "created")
	return c.reply(http.StatusOK, created)
}

func (c *call) listSnapshots() error {
	volume := c.r.PathValue("name")
	if err := c.authorize("list", "snapshots", c.opts.Namespace, ""); err != nil {
		return err
	}
	if _, err := volumes.cached(c, volume); err != nil {
		return err
	}
	snaps, err := c.opts.Cache.Snapshots.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, list[*v1beta1.Snapshot]{Items: sortedByName(snaps)})
}

func (c *call) getSnapshot() error {
	snap, err := c.namedSnapshot("get")
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, snap)
}

func (c *call) deleteSnapshot() error {
	snap, err := c.namedSnapshot("delete")
	if err != nil {
		return err
	}
	strata, err := c.strata()
	if err != nil {
		return err
	}
	if err := strata.StrataV1beta1().Snapshots(c.opts.Namespace).Delete(c.ctx(), snap.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	c.wrote(snap, snap.Name, "deleted")
	return c.reply(http.StatusNoContent, nil)
}

// namedSnapshot reads the body's snapshot name, authorizes verb on it and
// finds it among the volume's snapshots.
func (c *call) namedSnapshot(verb string) (*v1beta1.Snapshot, error) {
	volume := c.r.PathValue("name")
	var req snapshotRequest
	if err := c.decode(&req); err != nil {
		return nil, err
	}
	if req.Name == "" {
		return nil, badInput("name", "missing: name the snapshot")
	}
	if err := c.authorize(verb, "snapshots", c.opts.Namespace, req.Name); err != nil {
		return nil, err
	}
	snap, err := c.opts.Cache.Snapshots.GetRO(req.Name)
	if err != nil || snap.Spec.Volume != volume {
		return nil, fmt.Errorf("snapshot %q of volume %q: %w", req.Name, volume, errNotFound)
	}
	return snap, nil
}

// sortedByName orders objects by name, for lists that read the same twice.
func sortedByName[T metav1.Object](objs []T) []T {
	out := append([]T(nil), objs...)
	slices.SortFunc(out, func(a, b T) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}
