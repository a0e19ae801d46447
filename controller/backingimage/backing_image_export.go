package backingimage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// An export-from-volume image is a snapshot of a volume: the first-copy
// disk's manager takes a Snapshot CR of the volume (owned by the image),
// keeps the volume attached through a bim-ds-controller ticket (owned by
// the image too, so neither outlives it), and streams the snapshot from
// the engine's instance manager (SnapshotExport) into the copy. The file is
// stored raw whatever export-type says: replicas read raw backing files,
// and export-type only names the format a download of the image would
// take, which Strata does not serve yet. Once a copy is ready the owner
// releases the ticket and deletes the snapshot.

const jobExporting = "exporting from the volume"

// exportSnapshotName is the snapshot an image is exported from.
func exportSnapshotName(bi *v1beta1.BackingImage) string {
	return "bi-" + bi.Name + "-" + bi.Status.UUID
}

func exportTicketID(bi *v1beta1.BackingImage) string { return "bim-ds-" + bi.Name }

func (s *imageSync) exportOwnerRef() *v1beta1.TicketOwnerReference {
	return &v1beta1.TicketOwnerReference{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "BackingImage",
		Namespace: s.bi.Namespace, Name: s.bi.Name, UID: string(s.bi.UID)}
}

// startExport prepares the export onto the disk (snapshot, ticket,
// attachment) and starts the copy once the snapshot is ready and the
// volume's engine runs; until then the copy says what it waits for.
func (s *imageSync) startExport(k fileJobKey, diskPath string, st *v1beta1.BackingImageDiskFileStatus) error {
	bi := s.bi
	volName := bi.Spec.SourceParameters[v1beta1.BackingImageParameterVolumeName]
	vol, err := s.DS.Volumes.GetRO(volName)
	if apierrors.IsNotFound(err) {
		setFileState(st, v1beta1.BackingImageStatePending, 0, fmt.Sprintf("volume %s does not exist", volName), s.now)
		return nil
	}
	if err != nil {
		return err
	}
	snap, waiting, err := s.exportSnapshot(vol)
	if err != nil || waiting != "" {
		setFileState(st, v1beta1.BackingImageStatePending, 0, waiting, s.now)
		return err
	}
	if err := s.EnsureTicket(s.ctx, vol.Name, &v1beta1.AttachmentTicket{ID: exportTicketID(bi),
		Type: v1beta1.AttacherTypeBackingImageDataSourceController, NodeID: s.ControllerID,
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.AnyValue}, OwnerRef: s.exportOwnerRef()}); err != nil {
		return err
	}
	eng, err := s.VolumeEngine(vol)
	if err != nil {
		return err
	}
	if !kit.EngineRunning(eng) {
		setFileState(st, v1beta1.BackingImageStatePending, 0, fmt.Sprintf("waiting for volume %s to attach", vol.Name), s.now)
		return nil
	}
	client, err := s.EngineDataPlane(eng)
	if err != nil {
		return err
	}
	dir := kit.BackingImageDir(diskPath, bi.Name, bi.Status.UUID)
	engine, checksum := eng.Name, bi.Spec.Checksum
	s.startJob(k, jobExporting, func(ctx context.Context, report jobReport) (imagefile.Result, error) {
		return exportSnapshotTo(ctx, client, engine, snap, dir, checksum, report)
	})
	setFileState(st, v1beta1.BackingImageStateInProgress, 0, jobExporting, s.now)
	return nil
}

// exportSnapshot creates the image's snapshot of the volume, or says why it
// is not ready yet.
func (s *imageSync) exportSnapshot(vol *v1beta1.Volume) (string, string, error) {
	name := exportSnapshotName(s.bi)
	snap, err := s.DS.Snapshots.GetRO(name)
	if apierrors.IsNotFound(err) {
		_, err = s.DS.Snapshots.Create(s.ctx, &v1beta1.Snapshot{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.bi.Namespace,
				Labels: map[string]string{types.LabelVolume: vol.Name, types.LabelBackingImage: s.bi.Name},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "BackingImage",
					Name: s.bi.Name, UID: s.bi.UID}}},
			Spec: v1beta1.SnapshotSpec{Volume: vol.Name, CreateSnapshot: true, Labels: map[string]string{types.LabelBackingImage: s.bi.Name}},
		})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		return "", fmt.Sprintf("taking snapshot %s of volume %s", name, vol.Name), err
	}
	switch {
	case err != nil:
		return "", "", err
	case snap.Status.Error != "":
		return "", fmt.Sprintf("snapshot %s of volume %s failed: %s", name, vol.Name, snap.Status.Error), nil
	case !snap.Status.ReadyToUse:
		return "", fmt.Sprintf("waiting for snapshot %s of volume %s", name, vol.Name), nil
	}
	return name, "", nil
}

// exportSnapshotTo streams the snapshot into dir's source.part, then
// prepares it as a raw image (never sniffed: a volume's bytes may start
// like a qcow2 header and still be a raw disk).
func exportSnapshotTo(ctx context.Context, client engineapi.DataPlane, engine, snapshot, dir, checksum string,
	report jobReport) (imagefile.Result, error) {
	f, part, err := createSourcePart(dir)
	defer os.Remove(part)
	if err != nil {
		return imagefile.Result{}, err
	}
	var size int64
	err = client.SnapshotExport(ctx, engine, snapshot, func(c engineapi.ExportChunk) error {
		if c.VolumeSize > 0 {
			size = c.VolumeSize
			if err := f.Truncate(size); err != nil {
				return err
			}
		}
		if _, err := f.WriteAt(c.Data, c.Offset); err != nil {
			return err
		}
		report(percent(c.Offset+int64(len(c.Data)), size) * 9 / 10)
		return nil
	})
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		return imagefile.Result{}, fmt.Errorf("snapshot %s of engine %s: %w", snapshot, engine, err)
	}
	return imagefile.PrepareRaw(ctx, part, filepath.Join(dir, kit.BackingFileName), checksum)
}

// releaseExport drops the export's ticket and snapshot once a copy is ready
// (only what the cache still shows, so a quiet image costs no calls).
func (s *imageSync) releaseExport() error {
	bi := s.bi
	if bi.Spec.SourceType != v1beta1.BackingImageSourceTypeExportFromVolume || len(kit.ReadyCopies(bi)) == 0 {
		return nil
	}
	vol := bi.Spec.SourceParameters[v1beta1.BackingImageParameterVolumeName]
	if va, err := s.DS.VolumeAttachments.GetRO(vol); err == nil {
		if _, ok := va.Spec.AttachmentTickets[exportTicketID(bi)]; ok {
			if err := s.RemoveTicket(s.ctx, vol, exportTicketID(bi)); err != nil {
				return err
			}
		}
	}
	if _, err := s.DS.Snapshots.GetRO(exportSnapshotName(bi)); err == nil {
		if err := s.DS.Snapshots.Delete(s.ctx, exportSnapshotName(bi)); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}
