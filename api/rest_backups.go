package api

import (
	"errors"
	"fmt"
	"net/http"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Backups: list, get, create (of a volume, from a snapshot or a new one),
// delete, and restore into a new volume.
func backupRoutes() []route {
	return []route{
		{method: http.MethodGet, path: "/v1/backups", serve: backups.list},
		{method: http.MethodPost, path: "/v1/backups", serve: (*call).createBackup},
		{method: http.MethodGet, path: "/v1/backups/{name}", serve: backups.get},
		{method: http.MethodDelete, path: "/v1/backups/{name}", serve: backups.delete},
		{method: http.MethodPost, path: "/v1/backups/{name}", actions: map[string]func(*call) error{
			"restore": (*call).restoreBackup,
		}},
	}
}

// backupRequest is the body of a backup create: the volume, and the
// snapshot to back up (empty: a new one).
type backupRequest struct {
	Name     string            `json:"name"`
	Volume   string            `json:"volume"`
	Snapshot string            `json:"snapshot"`
	Labels   map[string]string `json:"labels"`
}

func (c *call) createBackup() error {
	var req backupRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	if req.Volume == "" {
		return badInput("volume", "missing: name the volume to back up")
	}
	if err := checkName(req.Name, false); err != nil {
		return err
	}
	if err := c.authorize("create", "backups", c.opts.Namespace, req.Name); err != nil {
		return err
	}
	// A backup is a copy of the volume's data that a restore reads back:
	// taking one needs the right to read the volume (issue 46).
	if err := c.authorize("get", "volumes", c.opts.Namespace, req.Volume); err != nil {
		return err
	}
	if _, err := volumes.cached(c, req.Volume); err != nil {
		return err
	}
	strata, err := c.strata()
	if err != nil {
		return err
	}
	b := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: c.opts.Namespace,
		Labels: map[string]string{types.LabelVolume: req.Volume}},
		Spec: v1beta1.BackupSpec{SnapshotName: req.Snapshot, Labels: req.Labels}}
	if req.Name == "" {
		b.GenerateName = "backup-"
	}
	c.stamp(b)
	created, err := strata.StrataV1beta1().Backups(c.opts.Namespace).Create(c.ctx(), b, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	c.wrote(created, created.Name, "created")
	return c.reply(http.StatusCreated, created)
}

// restoreRequest names the new volume a backup is restored into; its size
// is the backed-up volume's unless a larger one is given.
type restoreRequest struct {
	Name             string `json:"name"`
	Size             string `json:"size"`
	NumberOfReplicas int32  `json:"numberOfReplicas"`
}

func (c *call) restoreBackup() error {
	backup := c.r.PathValue("name")
	var req restoreRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	// The restore reads the Backup (its state, its size) and then its data:
	// the caller needs get on it, not only create on volumes (issue 46).
	if err := c.authorize("get", "backups", c.opts.Namespace, backup); err != nil {
		return err
	}
	b, err := backups.cached(c, backup)
	if err != nil {
		return err
	}
	if b.Status.State != v1beta1.BackupStateCompleted {
		return fmt.Errorf("backup %q is %s: %w", backup, orDash(string(b.Status.State)), errNotCompleted)
	}
	size := req.Size
	if size == "" {
		size = resource.NewQuantity(b.Status.VolumeSize, resource.BinarySI).String()
	}
	v, err := volumeRequest{Name: req.Name, Size: size, NumberOfReplicas: req.NumberOfReplicas, FromBackup: backup}.volume(c.opts.Namespace)
	if err != nil {
		return err
	}
	return volumes.create(c, v)
}

// errNotCompleted is a 409: a restore needs a completed backup.
var errNotCompleted = errors.New("only a completed backup can be restored")

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
