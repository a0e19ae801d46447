package csi

import (
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	k8stesting "k8s.io/client-go/testing"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// replicasGrow stands in for the volume and engine controllers: a spec
// update is followed by the replicas' new size in status.
func replicasGrow(e *dstest.Env) {
	e.Strata.PrependReactor("update", "volumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "" {
			v := a.(k8stesting.UpdateAction).GetObject().(*v1beta1.Volume)
			v.Status.CurrentSize = v.Spec.Size.Value()
		}
		return false, nil, nil
	})
}

func TestControllerExpandVolume(t *testing.T) {
	grown := existingVolume("pvc-1", 2<<20, 1)
	grown.Status.CurrentSize = 2 << 20
	tests := []struct {
		name       string
		existing   []runtime.Object
		react      func(*dstest.Env)
		id         string
		required   int64
		wantCode   codes.Code
		wantMsg    string
		wantSize   int64
		wantWrites []string
	}{
		{name: "grows: spec, then the replicas", existing: []runtime.Object{existingVolume("pvc-1", 1<<20, 1)}, react: replicasGrow,
			id: "pvc-1", required: 2<<20 + 1, wantSize: 2<<20 + 4096, wantWrites: []string{"update volumes"}},
		{name: "already that large: nothing written", existing: []runtime.Object{grown},
			id: "pvc-1", required: 1 << 20, wantSize: 2 << 20},
		{name: "the replicas do not grow in time", existing: []runtime.Object{existingVolume("pvc-1", 1<<20, 1)},
			id: "pvc-1", required: 2 << 20, wantCode: codes.DeadlineExceeded, wantMsg: "retry", wantWrites: []string{"update volumes"}},
		{name: "no such volume", id: "pvc-x", required: 1 << 20, wantCode: codes.NotFound, wantMsg: "pvc-x"},
		{name: "no volume id", required: 1 << 20, wantCode: codes.InvalidArgument, wantMsg: "volume_id"},
		{name: "refused by the webhook", existing: []runtime.Object{existingVolume("pvc-1", 1<<20, 1)},
			react: func(e *dstest.Env) {
				e.Strata.PrependReactor("update", "volumes", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewInvalid(schema.GroupKind{Group: "strata.io", Kind: "Volume"}, "pvc-1",
						field.ErrorList{field.Invalid(field.NewPath("spec", "size"), "", "too large for any disk")})
				})
			},
			id: "pvc-1", required: 2 << 20, wantCode: codes.FailedPrecondition, wantMsg: "too large for any disk", wantWrites: []string{"update volumes"}},
	}
	defer func(old time.Duration) { expandWait = old }(expandWait)
	expandWait = time.Second
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, env := controllerDriver(t, tc.existing, nil, tc.react)
			resp, err := d.ControllerExpandVolume(t.Context(), &csi.ControllerExpandVolumeRequest{VolumeId: tc.id,
				CapacityRange: &csi.CapacityRange{RequiredBytes: tc.required}})
			assert.Equal(t, tc.wantWrites, writeActions(env), "API writes")
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			assert.Equal(t, tc.wantSize, resp.CapacityBytes)
			assert.True(t, resp.NodeExpansionRequired, "the node's device grows too")
		})
	}
}
