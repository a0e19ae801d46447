package volume

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

// The data plane serves whole 4 KiB blocks; spec.size is rounded up to what
// the device will hold, so the two never disagree.
func TestMutatorRoundsSizeUpToBlocks(t *testing.T) {
	sized := func(size string) *v1beta1.Volume {
		return vol(func(v *v1beta1.Volume) {
			v.Spec.Size = resource.MustParse(size)
			v.Finalizers = []string{types.FinalizerName}
		})
	}
	tests := []struct {
		name      string
		old       *v1beta1.Volume // nil: create
		obj       *v1beta1.Volume
		wantSize  string
		wantPatch string
	}{
		{name: "1000 bytes become one block", obj: sized("1000"), wantSize: "4096",
			wantPatch: `[{"op":"add","path":"/spec/size","value":"4096"}]`},
		{name: "a block stays", obj: sized("4096"), wantSize: "4096"},
		{name: "4Ki stays", obj: sized("4Ki"), wantSize: "4Ki"},
		{name: "1Gi stays", obj: sized("1Gi"), wantSize: "1Gi"},
		{name: "4097 bytes become two blocks", obj: sized("4097"), wantSize: "8192"},
		{name: "1G is not whole blocks", obj: sized("1G"), wantSize: "1000001536",
			wantPatch: `[{"op":"add","path":"/spec/size","value":"1000001536"}]`},
		{name: "binary notation stays binary", obj: sized("1025Ki"), wantSize: "1028Ki"},
		{name: "a fraction of a byte is a byte", obj: sized("1500m"), wantSize: "4096"},
		{name: "zero is left to the validator", obj: sized("0"), wantSize: "0"},
		{name: "a negative size is left to the validator", obj: sized("-1"), wantSize: "-1"},
		{name: "an expansion is rounded up", old: sized("1Gi"), obj: sized("2049Mi"), wantSize: "2049Mi"},
		{name: "an expansion by a byte is rounded up", old: sized("4096"), obj: sized("4097"), wantSize: "8192",
			wantPatch: `[{"op":"add","path":"/spec/size","value":"8192"}]`},
		{name: "an unchanged size stored before rounding is left as it is", old: sized("1000"), obj: sized("1000"),
			wantSize: "1k"},
	}
	env := dstest.New(t, nil, nil)
	h := admissiontest.NewHandler(t, NewMutator(env.DS), nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var old runtime.Object
			if tc.old != nil {
				old = tc.old
			}
			resp, obj := admissiontest.Mutate(t, h, Resource, admissiontest.Request(Resource, admissiontest.Admin, old, tc.obj))
			require.True(t, resp.Allowed, admissiontest.Denial(resp))
			assert.Equal(t, tc.wantSize, obj.(*v1beta1.Volume).Spec.Size.String())
			if tc.wantPatch != "" {
				assert.JSONEq(t, tc.wantPatch, string(resp.Patch))
			} else if tc.wantSize == tc.obj.Spec.Size.String() {
				assert.Empty(t, resp.Patch)
			}
		})
	}
}
