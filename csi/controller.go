package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// StorageClass parameters CreateVolume understands. The external-provisioner
// adds the csi.storage.k8s.io/* ones itself (PVC and PV names with
// --extra-create-metadata); the claim's name and namespace are kept as
// annotations, so `kubectl get vol -o yaml` says whose volume it is.
const (
	ParamNumberOfReplicas = "numberOfReplicas"
	// The backing image under a new volume; when it does not exist and a URL
	// is given, CreateVolume creates it (a download, checked against the
	// checksum when one is given).
	ParamBackingImage         = "backingImage"
	ParamBackingImageURL      = "backingImageURL"
	ParamBackingImageChecksum = "backingImageChecksum"
	// ParamDataLocality is the volume's spec.dataLocality (disabled or
	// best-effort: keep a replica where the volume is attached).
	ParamDataLocality = "dataLocality"
	// ParamFreezeFilesystem is the volume's spec.freezeFilesystemForSnapshot
	// (enabled, disabled, ignored: the setting decides).
	ParamFreezeFilesystem = "freezeFilesystemForSnapshot"
	provisionerPrefix     = "csi.storage.k8s.io/"
	paramPVCName          = "csi.storage.k8s.io/pvc/name"
	paramPVCNamespace     = "csi.storage.k8s.io/pvc/namespace"
	AnnotationPVCName     = "strata.io/pvc-name"
	// AnnotationCSIName is the name CreateVolume/CreateSnapshot was called
	// with, when it could not be the object's name as it is.
	AnnotationCSIName      = types.AnnotationCSIName
	AnnotationPVCNamespace = "strata.io/pvc-namespace"
)

// maxReplicas mirrors the Volume CRD's bound on spec.numberOfReplicas.
const maxReplicas = 20

// createWait bounds how long CreateVolume waits for the volume to be
// scheduled; the provisioner retries after it, and a retry with the same
// name picks up the same volume.
var createWait = 30 * time.Second

func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// volumeRequest is a CreateVolume request checked and turned into a spec.
type volumeRequest struct {
	name        string
	size        int64
	replicas    int32 // 0: the default-replica-count setting applies
	annotations map[string]string
	dataSource  string // spec.dataSource: "" or the content source's snap:// or vol:// form
	// sourceBackingImage is the content source's volume's backing image.
	sourceBackingImage string
	image              backingImageParams
	fromBackup         string // spec.fromBackup: the StorageClass's fromBackup
	dataLocality       v1beta1.DataLocality
	freezeFilesystem   v1beta1.FreezeFilesystem
	// sizeGiven: the request named a capacity; else a content source's size applies.
	sizeGiven bool
}

func parseCreateVolume(req *csi.CreateVolumeRequest) (*volumeRequest, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name: required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}

	size, err := volumeSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	v := &volumeRequest{name: volumeIDFor(req.GetName()), size: size, sizeGiven: req.GetCapacityRange().GetRequiredBytes() > 0,
		annotations: map[string]string{AnnotationCSIName: req.GetName()}}
	params, err := parseParameters(req.GetParameters(), v.annotations)
	if err != nil {
		return nil, err
	}
	v.replicas, v.image, v.fromBackup, v.dataLocality = params.replicas, params.image, params.fromBackup, params.dataLocality
	v.freezeFilesystem = params.freezeFilesystem
	return v, nil
}

// classParameters are a StorageClass's parameters.
type classParameters struct {
	replicas   int32 // 0: the default-replica-count setting applies
	image      backingImageParams
	fromBackup string
	// dataLocality is "" unless the class names it.
	dataLocality v1beta1.DataLocality
	// freezeFilesystem is "" unless the class names it.
	freezeFilesystem v1beta1.FreezeFilesystem
}

// parseParameters reads a StorageClass's parameters (CreateVolume and
// GetCapacity get the same ones): the replica count, the backing image, and
// the provisioner's claim metadata, kept in annotations. Anything else is
// refused, naming the parameters known.
func parseParameters(params, annotations map[string]string) (classParameters, error) {
	var p classParameters
	for key, value := range params {
		switch {
		case key == ParamNumberOfReplicas:
			n, err := strconv.Atoi(value)
			if err != nil || n < 1 || n > maxReplicas {
				return p, status.Errorf(codes.InvalidArgument, "parameter %s=%q: must be a whole number from 1 to %d",
					key, value, maxReplicas)
			}
			p.replicas = int32(n)
		case key == ParamDataLocality:
			switch l := v1beta1.DataLocality(value); l {
			case v1beta1.DataLocalityDisabled, v1beta1.DataLocalityBestEffort:
				p.dataLocality = l
			default:
				return p, status.Errorf(codes.InvalidArgument, "parameter %s=%q: must be %s or %s",
					key, value, v1beta1.DataLocalityDisabled, v1beta1.DataLocalityBestEffort)
			}
		case key == ParamFreezeFilesystem:
			switch f := v1beta1.FreezeFilesystem(value); f {
			case v1beta1.FreezeFilesystemEnabled, v1beta1.FreezeFilesystemDisabled, v1beta1.FreezeFilesystemIgnored:
				p.freezeFilesystem = f
			default:
				return p, status.Errorf(codes.InvalidArgument, "parameter %s=%q: must be %s, %s or %s", key, value,
					v1beta1.FreezeFilesystemEnabled, v1beta1.FreezeFilesystemDisabled, v1beta1.FreezeFilesystemIgnored)
			}
		case key == ParamBackingImage:
			p.image.name = value
		case key == ParamBackingImageURL:
			p.image.url = value
		case key == ParamBackingImageChecksum:
			p.image.checksum = value
		case key == ParamFromBackup:
			if errs := validation.IsDNS1123Subdomain(value); len(errs) > 0 {
				return p, status.Errorf(codes.InvalidArgument, "parameter %s=%q: not a valid backup name: %s", key, value, errs[0])
			}
			p.fromBackup = value
		case key == paramPVCName:
			annotations[AnnotationPVCName] = value
		case key == paramPVCNamespace:
			annotations[AnnotationPVCNamespace] = value
		case strings.HasPrefix(key, provisionerPrefix):
			// other provisioner metadata (the PV name): nothing to keep
		default:
			return p, status.Errorf(codes.InvalidArgument, "parameter %q: unknown (known: %s)", key,
				strings.Join([]string{ParamNumberOfReplicas, ParamBackingImage, ParamBackingImageURL, ParamBackingImageChecksum,
					ParamFromBackup, ParamDataLocality, ParamFreezeFilesystem}, ", "))
		}
	}
	return p, p.image.check()
}

// volumeIDFor is the volume a CreateVolume name stands for: the name itself
// when it is a valid volume name (the external-provisioner's pvc-<uid> is),
// else a name derived from its hash, so that the same name always finds the
// same volume. CSI names may be any string of up to 128 characters.
func volumeIDFor(name string) string {
	if len(name) <= 63 && len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	return derivedName("vol", name)
}

// derivedName is prefix-<hash of name>, a valid object and snapshot name.
func derivedName(prefix, name string) string {
	sum := sha256.Sum256([]byte(name))
	return prefix + "-" + hex.EncodeToString(sum[:12])
}

// volumeSize is the smallest size the data plane serves that meets the
// request: a whole number of blocks, at least one.
func volumeSize(r *csi.CapacityRange) (int64, error) {
	required, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "capacity_range: negative bytes (required %d, limit %d)", required, limit)
	}
	size, ok := types.RoundUpToBlock(max(required, types.BlockSize))
	if !ok {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range: %d bytes is too large to round up to a whole %d-byte block",
			required, types.BlockSize)
	}
	if limit > 0 && size > limit {
		return 0, status.Errorf(codes.OutOfRange,
			"capacity_range: %d bytes rounded up to the %d-byte block is %d, above limit_bytes %d",
			required, types.BlockSize, size, limit)
	}
	return size, nil
}

// kubernetesAccessMode names the PVC access mode a CSI mode comes from, for
// messages a Kubernetes user reads in the claim's events.
var kubernetesAccessMode = map[csi.VolumeCapability_AccessMode_Mode]string{
	csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:  " (ReadWriteMany)",
	csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:   " (ReadOnlyMany)",
	csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER: " (ReadWriteMany with one writer)",
}

// checkCapabilities accepts single-node access in mount or block mode; a
// volume is attached to one node at a time until shared volumes exist.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume_capabilities: required")
	}
	for _, c := range caps {
		if c.GetBlock() == nil && c.GetMount() == nil {
			return status.Error(codes.InvalidArgument, "volume_capabilities: access_type must be block or mount")
		}
		switch mode := c.GetAccessMode().GetMode(); mode {
		case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		default:
			return status.Errorf(codes.InvalidArgument,
				"volume_capabilities: access mode %s%s is not supported: a Strata volume is attached to one node at a time",
				mode, kubernetesAccessMode[mode])
		}
		if fs := c.GetMount().GetFsType(); fs != "" && fs != "ext4" && fs != "xfs" {
			return status.Errorf(codes.InvalidArgument, "volume_capabilities: fs_type %q is not supported (ext4 or xfs)", fs)
		}
	}
	return nil
}

func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	want, err := parseCreateVolume(req)
	if err != nil {
		return nil, err
	}
	if err := d.resolveContentSource(ctx, req.GetVolumeContentSource(), req.GetCapacityRange(), want); err != nil {
		return nil, err
	}
	if err := d.resolveFromBackup(ctx, req.GetCapacityRange(), want); err != nil {
		return nil, err
	}
	if err := d.resolveBackingImage(ctx, req.GetCapacityRange(), want); err != nil {
		return nil, err
	}
	vol, err := d.ensureVolume(ctx, want)
	if err != nil {
		return nil, err
	}
	if vol, err = d.waitScheduled(ctx, vol.Name); err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: vol.Name, CapacityBytes: vol.Spec.Size.Value(),
		ContentSource: req.GetVolumeContentSource()}}, nil
}

// resolveContentSource turns a content source into the volume's data
// source: a snapshot (the Snapshot CR the snapshot id names) or a whole
// volume, which the clone controller copies in. A source that does not
// exist is NotFound, one larger than the requested capacity OutOfRange; with
// no capacity requested the volume takes the source's size.
func (d *Driver) resolveContentSource(ctx context.Context, src *csi.VolumeContentSource, r *csi.CapacityRange, want *volumeRequest) error {
	if src == nil {
		return nil
	}
	var sourceSize int64
	var what string
	switch {
	case src.GetSnapshot() != nil:
		id := src.GetSnapshot().GetSnapshotId()
		snap, err := d.ds.Snapshots.GetROOrLive(ctx, id)
		if err != nil {
			return apiStatus(err, "volume_content_source: snapshot "+id)
		}
		if snap.DeletionTimestamp != nil {
			return status.Errorf(codes.NotFound, "volume_content_source: snapshot %s is being deleted", id)
		}
		if !snap.Status.ReadyToUse {
			return status.Errorf(codes.Unavailable, "volume_content_source: snapshot %s is not ready to use yet", id)
		}
		want.dataSource = types.DataSource{Volume: snap.Spec.Volume, Snapshot: snap.Name}.String()
		if vol, err := d.ds.Volumes.GetROOrLive(ctx, snap.Spec.Volume); err == nil {
			want.sourceBackingImage = vol.Spec.BackingImage
		}
		sourceSize, what = snap.Status.RestoreSize, "snapshot "+id
	case src.GetVolume() != nil:
		id := src.GetVolume().GetVolumeId()
		vol, err := d.ds.Volumes.GetROOrLive(ctx, id)
		if err != nil {
			return apiStatus(err, "volume_content_source: volume "+id)
		}
		if vol.DeletionTimestamp != nil {
			return status.Errorf(codes.NotFound, "volume_content_source: volume %s is being deleted", id)
		}
		want.dataSource = types.DataSource{Volume: vol.Name}.String()
		want.sourceBackingImage = vol.Spec.BackingImage
		sourceSize, what = max(vol.Spec.Size.Value(), vol.Status.CurrentSize), "volume "+id
	default:
		return status.Error(codes.InvalidArgument, "volume_content_source: neither a snapshot nor a volume")
	}
	switch {
	case !want.sizeGiven && sourceSize > want.size:
		want.size = sourceSize
	case sourceSize > want.size:
		return status.Errorf(codes.OutOfRange, "capacity_range: %d bytes is smaller than the content source (%s has %d bytes)",
			want.size, what, sourceSize)
	}
	if limit := r.GetLimitBytes(); limit > 0 && want.size > limit {
		return status.Errorf(codes.OutOfRange, "capacity_range: the content source (%s) has %d bytes, above limit_bytes %d",
			what, sourceSize, limit)
	}
	return nil
}

// ensureVolume creates the volume, or returns the one an earlier call with
// the same name created when it matches the request.
func (d *Driver) ensureVolume(ctx context.Context, want *volumeRequest) (*v1beta1.Volume, error) {
	existing, err := d.ds.Volumes.GetROOrLive(ctx, want.name)
	switch {
	case err == nil:
		if got := existing.Spec.Size.Value(); got != want.size {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with size %d bytes, requested %d", want.name, got, want.size)
		}
		if want.replicas != 0 && existing.Spec.NumberOfReplicas != want.replicas {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with %d replicas, requested %d",
				want.name, existing.Spec.NumberOfReplicas, want.replicas)
		}
		if existing.Spec.DataSource != want.dataSource {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with data source %q, requested %q",
				want.name, existing.Spec.DataSource, want.dataSource)
		}
		if existing.Spec.FromBackup != want.fromBackup {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists restored from backup %q, requested %q",
				want.name, existing.Spec.FromBackup, want.fromBackup)
		}
		if existing.Spec.BackingImage != want.image.name {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with backing image %q, requested %q",
				want.name, existing.Spec.BackingImage, want.image.name)
		}
		if existing.DeletionTimestamp != nil {
			return nil, status.Errorf(codes.Aborted, "volume %s is being deleted; retry once it is gone", want.name)
		}
		return existing, nil
	case !apierrors.IsNotFound(err):
		return nil, apiStatus(err, "reading volume "+want.name)
	}
	vol := &v1beta1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: want.name, Namespace: d.ds.Namespace, Annotations: want.annotations},
		Spec: v1beta1.VolumeSpec{Size: *resource.NewQuantity(want.size, resource.BinarySI),
			NumberOfReplicas: want.replicas, Frontend: v1beta1.VolumeFrontendNBD, DataSource: want.dataSource,
			BackingImage: want.image.name, FromBackup: want.fromBackup, DataLocality: want.dataLocality,
			FreezeFilesystemForSnapshot: want.freezeFilesystem},
	}
	created, err := d.ds.Volumes.Create(ctx, vol)
	if apierrors.IsAlreadyExists(err) { // a concurrent call won: judge its volume
		return d.ensureVolume(ctx, want)
	}
	if err != nil {
		return nil, apiStatus(err, "creating volume "+want.name)
	}
	d.log.WithFields(map[string]any{"volume": want.name, "size": want.size, "replicas": want.replicas,
		"dataSource": want.dataSource, "fromBackup": want.fromBackup}).Info("Created volume")
	return created, nil
}

// waitScheduled waits until the volume has left the creating state. A volume
// whose replicas cannot be placed is deleted again and the reason returned,
// so that the provisioner's retry starts afresh rather than finding it.
func (d *Driver) waitScheduled(ctx context.Context, name string) (*v1beta1.Volume, error) {
	var vol *v1beta1.Volume
	var unschedulable string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, createWait, true, func(context.Context) (bool, error) {
		v, err := d.ds.Volumes.GetRO(name)
		if err != nil {
			return false, nil // the cache has not seen it yet
		}
		vol = v
		if c := findCondition(v.Status.Conditions, "Scheduled"); c != nil && c.Status == metav1.ConditionFalse {
			unschedulable = c.Message
			return true, nil
		}
		return v.Status.State != "" && v.Status.State != v1beta1.VolumeStateCreating, nil
	})
	if unschedulable != "" {
		if err := d.ds.Volumes.Delete(ctx, name); err != nil && !apierrors.IsNotFound(err) {
			d.log.WithError(err).WithField("volume", name).Warn("Could not delete an unschedulable volume")
		}
		return nil, status.Errorf(codes.ResourceExhausted, "volume %s: replicas cannot be placed: %s", name, unschedulable)
	}
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "volume %s: not created within %s (state %q); retry",
			name, createWait, stateOf(vol))
	}
	return vol, nil
}

func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: required")
	}
	err := d.ds.Volumes.Delete(ctx, req.GetVolumeId())
	if apierrors.IsConflict(err) { // the webhook's refusal of a volume still attached for a workload
		return nil, status.Errorf(codes.FailedPrecondition, "deleting volume %s: %v", req.GetVolumeId(), err)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, apiStatus(err, "deleting volume "+req.GetVolumeId())
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: required")
	}
	if _, err := d.ds.Volumes.GetROOrLive(ctx, req.GetVolumeId()); err != nil {
		return nil, apiStatus(err, "volume "+req.GetVolumeId())
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		if status.Code(err) == codes.InvalidArgument && len(req.GetVolumeCapabilities()) > 0 {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
		return nil, err
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters()}}, nil
}

// apiStatus maps an API server error to the CSI code a sidecar acts on.
func apiStatus(err error, what string) error {
	code := codes.Internal
	switch {
	case apierrors.IsNotFound(err):
		code = codes.NotFound
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		code = codes.Aborted
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		// The admission webhooks refuse with a reason the user must act on.
		code = codes.FailedPrecondition
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err),
		errors.Is(err, context.DeadlineExceeded):
		code = codes.Unavailable
	}
	return status.Errorf(code, "%s: %v", what, err)
}

func findCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

func stateOf(v *v1beta1.Volume) string {
	if v == nil {
		return "not seen yet"
	}
	return fmt.Sprint(v.Status.State)
}
