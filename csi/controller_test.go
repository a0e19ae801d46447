package csi

import (
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

var volumesGR = schema.GroupResource{Group: "strata.io", Resource: "volumes"}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
}

var rwo = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func createReq(name string, required int64, params map[string]string) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: required},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: params}
}

func existingVolume(name string, size int64, replicas int32) *v1beta1.Volume {
	return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
		Spec:   v1beta1.VolumeSpec{Size: *resource.NewQuantity(size, resource.BinarySI), NumberOfReplicas: replicas},
		Status: v1beta1.VolumeStatus{State: v1beta1.VolumeStateDetached}}
}

// onCreate stands in for the volume controller, which the fakes lack: it
// gives every created volume the status the controller would.
func onCreate(env *dstest.Env, edit func(*v1beta1.Volume)) {
	env.Strata.PrependReactor("create", "volumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		edit(a.(k8stesting.CreateAction).GetObject().(*v1beta1.Volume))
		return false, nil, nil // the tracker stores the edited object
	})
}

func fromSource(name string, required int64, src *csi.VolumeContentSource) *csi.CreateVolumeRequest {
	r := createReq(name, required, nil)
	r.VolumeContentSource = src
	return r
}

func volumeSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

func snapshotSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

// readySnapshot is a snapshot of volume; a restore size of 0 means not ready yet.
func readySnapshot(name, volume string, restoreSize int64) *v1beta1.Snapshot {
	return &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
		Spec:   v1beta1.SnapshotSpec{Volume: volume, CreateSnapshot: true},
		Status: v1beta1.SnapshotStatus{ReadyToUse: restoreSize > 0, RestoreSize: restoreSize}}
}

// controllerDriver is a controller-mode driver over fake clientsets seeded
// with strata and kube objects, react's reactors installed and the seeding
// calls forgotten, so a test sees only its own call's writes.
func controllerDriver(t *testing.T, strata, kube []runtime.Object, react func(*dstest.Env)) (*Driver, *dstest.Env) {
	t.Helper()
	env := dstest.New(t, strata, kube)
	if react != nil {
		react(env)
	}
	d, err := NewDriver(Options{Mode: ModeController, Version: "test", Store: env.DS, Log: logrus.New()})
	require.NoError(t, err)
	env.ClearActions()
	return d, env
}

func detachedOnCreate(v *v1beta1.Volume) { v.Status.State = v1beta1.VolumeStateDetached }

func TestCreateVolume(t *testing.T) {
	tests := []struct {
		name     string
		existing []runtime.Object
		react    func(*dstest.Env)
		req      *csi.CreateVolumeRequest
		wantCode codes.Code
		wantMsg  string
		wantSize int64
		wantID   string // "": the request's name
		// the volume's spec.dataSource
		wantSource string
		// the writes expected, as "verb resource"
		wantWrites []string
	}{
		{name: "new volume, size rounded up to the block", react: func(e *dstest.Env) { onCreate(e, detachedOnCreate) },
			req:      createReq("pvc-1", 1_000_000, map[string]string{"numberOfReplicas": "2", "csi.storage.k8s.io/pvc/name": "data"}),
			wantSize: 1_003_520, wantWrites: []string{"create volumes"}},
		{name: "same name and size: the existing volume", existing: []runtime.Object{existingVolume("pvc-1", 1<<20, 2)},
			req: createReq("pvc-1", 1<<20, map[string]string{"numberOfReplicas": "2"}), wantSize: 1 << 20},
		{name: "same name, other size", existing: []runtime.Object{existingVolume("pvc-1", 1<<20, 2)},
			req: createReq("pvc-1", 2<<20, nil), wantCode: codes.AlreadyExists, wantMsg: "exists with size 1048576 bytes, requested 2097152"},
		{name: "same name, other replica count", existing: []runtime.Object{existingVolume("pvc-1", 1<<20, 2)},
			req: createReq("pvc-1", 1<<20, map[string]string{"numberOfReplicas": "3"}), wantCode: codes.AlreadyExists, wantMsg: "2 replicas, requested 3"},
		{name: "unknown parameter", req: createReq("pvc-1", 1<<20, map[string]string{"staleReplicaTimeout": "30"}),
			wantCode: codes.InvalidArgument, wantMsg: `parameter "staleReplicaTimeout": unknown`},
		{name: "replicas out of range", req: createReq("pvc-1", 1<<20, map[string]string{"numberOfReplicas": "0"}),
			wantCode: codes.InvalidArgument, wantMsg: "numberOfReplicas=\"0\": must be a whole number from 1 to 20"},
		{name: "multi-node writer", req: &csi.CreateVolumeRequest{Name: "pvc-1",
			VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}},
			wantCode: codes.InvalidArgument, wantMsg: "MULTI_NODE_MULTI_WRITER (ReadWriteMany) is not supported"},
		{name: "no capabilities", req: &csi.CreateVolumeRequest{Name: "pvc-1"}, wantCode: codes.InvalidArgument, wantMsg: "volume_capabilities: required"},
		{name: "limit below the rounded size", req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 5000, LimitBytes: 6000}}, wantCode: codes.OutOfRange, wantMsg: "above limit_bytes 6000"},
		{name: "a name that cannot be a volume's: a name derived from it", react: func(e *dstest.Env) { onCreate(e, detachedOnCreate) },
			req: createReq("PVC_1", 1<<20, nil), wantID: volumeIDFor("PVC_1"), wantSize: 1 << 20, wantWrites: []string{"create volumes"}},
		{name: "content source: a volume, size taken from it", existing: []runtime.Object{existingVolume("src", 1<<20, 1)},
			react: func(e *dstest.Env) { onCreate(e, detachedOnCreate) },
			req:   fromSource("pvc-1", 0, volumeSource("src")), wantSize: 1 << 20, wantSource: "vol://src",
			wantWrites: []string{"create volumes"}},
		{name: "content source: a ready snapshot", existing: []runtime.Object{existingVolume("src", 1<<20, 1), readySnapshot("snap-1", "src", 1<<20)},
			react: func(e *dstest.Env) { onCreate(e, detachedOnCreate) },
			req:   fromSource("pvc-1", 2<<20, snapshotSource("snap-1")), wantSize: 2 << 20, wantSource: "snap://src/snap-1",
			wantWrites: []string{"create volumes"}},
		{name: "content source: same name, other source",
			existing: []runtime.Object{existingVolume("src", 1<<20, 1), existingVolume("pvc-1", 1<<20, 1)},
			req:      fromSource("pvc-1", 1<<20, volumeSource("src")), wantCode: codes.AlreadyExists, wantMsg: `data source "", requested "vol://src"`},
		{name: "content source larger than the capacity", existing: []runtime.Object{existingVolume("src", 2<<20, 1)},
			req: fromSource("pvc-1", 1<<20, volumeSource("src")), wantCode: codes.OutOfRange, wantMsg: "smaller than the content source (volume src has 2097152 bytes)"},
		{name: "content source: a snapshot not ready yet", existing: []runtime.Object{existingVolume("src", 1<<20, 1), readySnapshot("snap-1", "src", 0)},
			req: fromSource("pvc-1", 1<<20, snapshotSource("snap-1")), wantCode: codes.Unavailable, wantMsg: "not ready to use yet"},
		{name: "content source missing", req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "snap-x"}}}},
			wantCode: codes.NotFound, wantMsg: `"snap-x" not found`},
		{name: "replicas cannot be placed: volume deleted again, reason returned",
			react: func(e *dstest.Env) {
				onCreate(e, func(v *v1beta1.Volume) {
					v.Status.State = v1beta1.VolumeStateCreating
					v.Status.Conditions = []metav1.Condition{{Type: "Scheduled", Status: metav1.ConditionFalse,
						Reason: "ReplicaUnschedulable", Message: "no disk has 1 TiB free"}}
				})
			},
			req: createReq("pvc-1", 1<<40, nil), wantCode: codes.ResourceExhausted, wantMsg: "no disk has 1 TiB free",
			wantWrites: []string{"create volumes", "delete volumes"}},
		{name: "API server unavailable", react: func(e *dstest.Env) {
			e.Strata.PrependReactor("create", "volumes", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewServerTimeout(volumesGR, "create", 1)
			})
		}, req: createReq("pvc-1", 1<<20, nil), wantCode: codes.Unavailable, wantMsg: "creating volume pvc-1", wantWrites: []string{"create volumes"}},
		{name: "not created in time", react: func(e *dstest.Env) { onCreate(e, func(*v1beta1.Volume) {}) },
			req: createReq("pvc-1", 1<<20, nil), wantCode: codes.DeadlineExceeded, wantMsg: "not created within", wantWrites: []string{"create volumes"}},
	}
	defer func(old time.Duration) { createWait = old }(createWait)
	createWait = time.Second
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, env := controllerDriver(t, tc.existing, nil, tc.react)
			resp, err := d.CreateVolume(t.Context(), tc.req)
			assert.Equal(t, tc.wantWrites, writeActions(env), "API writes")
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			wantID := tc.wantID
			if wantID == "" {
				wantID = tc.req.Name
			}
			assert.Equal(t, wantID, resp.Volume.VolumeId)
			assert.Equal(t, tc.wantSize, resp.Volume.CapacityBytes)
			vol, err := env.Strata.StrataV1beta1().Volumes(types.DefaultNamespace).Get(t.Context(), wantID, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, tc.wantSize, vol.Spec.Size.Value())
			assert.Equal(t, tc.wantSource, vol.Spec.DataSource)
			assert.Equal(t, tc.req.VolumeContentSource, resp.Volume.ContentSource)
			if len(tc.existing) == 0 {
				assert.Equal(t, tc.req.Name, vol.Annotations[AnnotationCSIName], "the CSI name is kept on the volume")
				if claim := tc.req.Parameters["csi.storage.k8s.io/pvc/name"]; claim != "" {
					assert.Equal(t, claim, vol.Annotations[AnnotationPVCName], "the claim is named on the volume")
				}
			}
		})
	}
}

func TestDeleteVolume(t *testing.T) {
	tests := []struct {
		name     string
		existing []runtime.Object
		refuse   error
		wantCode codes.Code
	}{
		{name: "existing volume", existing: []runtime.Object{existingVolume("pvc-1", 1<<20, 1)}},
		{name: "already gone: success"},
		{name: "refused while attached for a workload", existing: []runtime.Object{existingVolume("pvc-1", 1<<20, 1)},
			refuse: apierrors.NewConflict(volumesGR, "pvc-1", nil), wantCode: codes.FailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, tc.existing, nil)
			if tc.refuse != nil {
				env.Strata.PrependReactor("delete", "volumes", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.refuse
				})
			}
			d, err := NewDriver(Options{Mode: ModeController, Version: "test", Store: env.DS})
			require.NoError(t, err)
			_, err = d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: "pvc-1"})
			assert.Equal(t, tc.wantCode, status.Code(err), "%v", err)
		})
	}
}

func TestValidateVolumeCapabilities(t *testing.T) {
	d, _ := controllerDriver(t, []runtime.Object{existingVolume("pvc-1", 1<<20, 1)}, nil, nil)

	ok, err := d.ValidateVolumeCapabilities(t.Context(), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "pvc-1",
		VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	require.NoError(t, err)
	assert.NotNil(t, ok.Confirmed)

	notOK, err := d.ValidateVolumeCapabilities(t.Context(), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "pvc-1",
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}})
	require.NoError(t, err)
	assert.Nil(t, notOK.Confirmed)
	assert.Contains(t, notOK.Message, "MULTI_NODE_MULTI_WRITER")

	_, err = d.ValidateVolumeCapabilities(t.Context(), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "missing",
		VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	assert.Equal(t, codes.NotFound, status.Code(err))
}

func writeActions(env *dstest.Env) []string {
	var out []string
	for _, a := range env.Strata.Actions() {
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	return out
}

// wantResult checks a call's outcome against the expected code (OK: no
// error) and message; it reports whether the call succeeded, so the caller
// goes on to check the response.
func wantResult(t *testing.T, err error, code codes.Code, msg string) bool {
	t.Helper()
	if code == codes.OK {
		require.NoError(t, err)
		return true
	}
	require.Error(t, err)
	assert.Equal(t, code, status.Code(err), "code of %v", err)
	assert.Contains(t, status.Convert(err).Message(), msg)
	return false
}
