package quota

import (
	"cmp"
	"context"
	"errors"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const quotaKey = "apps/" + v1beta1.DefaultResourceQuotaName

// quotaPV is a bound PV: driver's volume handle for claim namespace/claim.
func quotaPV(driver, volume, namespace, claim string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + volume},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: volume}},
			ClaimRef:               &corev1.ObjectReference{Namespace: namespace, Name: claim, UID: k8stypes.UID("uid-" + claim)}}}
}

func quotaPVC(namespace, claim, pv string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: namespace, UID: k8stypes.UID("uid-" + claim)},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv}}
}

func sizedSnapshot(name, volume string, size int64, removed bool) *v1beta1.Snapshot {
	return fixture.Snapshot(name, true, func(s *v1beta1.Snapshot) {
		s.Spec.Volume, s.Labels[types.LabelVolume] = volume, volume
		s.Status.Size, s.Status.MarkRemoved = size, removed
	})
}

// quotaWorldRemoved is what deleted snapshots of va still hold.
const quotaWorldRemoved = 40

func testQuota(mut ...func(*v1beta1.ResourceQuota)) *v1beta1.ResourceQuota {
	rq := &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: "apps"}}
	for _, m := range mut {
		m(rq)
	}
	return rq
}

func withUsage(ns int64, vms map[string]int64) func(*v1beta1.ResourceQuota) {
	return func(rq *v1beta1.ResourceQuota) {
		rq.Status.SnapshotLimitStatus.NamespaceTotalSnapshotSizeUsage = resource.NewQuantity(ns, resource.BinarySI)
		rq.Status.SnapshotLimitStatus.NamespaceRemovedSnapshotSizeUsage = resource.NewQuantity(quotaWorldRemoved, resource.BinarySI)
		for name, n := range vms {
			if rq.Status.SnapshotLimitStatus.VMTotalSnapshotSizeUsage == nil {
				rq.Status.SnapshotLimitStatus.VMTotalSnapshotSizeUsage = map[string]resource.Quantity{}
			}
			rq.Status.SnapshotLimitStatus.VMTotalSnapshotSizeUsage[name] = *resource.NewQuantity(n, resource.BinarySI)
		}
	}
}

func testVM(namespace, name string, claims ...string) *unstructured.Unstructured {
	var volumes []any
	for _, c := range claims {
		volumes = append(volumes, map[string]any{"name": c, "persistentVolumeClaim": map[string]any{"claimName": c}})
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{"volumes": volumes}}}}}
}

// quotaWorld: apps has claims a (volume va, 10+20 bytes; a removed
// snapshot's CR of 100 not counted, but the 40 bytes its volume's status
// says deleted snapshots still hold are) and b (vb, 5); other has vo
// (1000); vx belongs to another driver. VM vm1 uses a and b, vm2 uses b
// alone.
func quotaWorld() (strata []runtime.Object, kube []runtime.Object, vms []*unstructured.Unstructured) {
	strata = []runtime.Object{fixture.SchedNode("node-1"), fixture.SchedNode("node-2"), fixture.SchedNode("node-3"),
		sizedSnapshot("a1", "va", 10, false), sizedSnapshot("a2", "va", 20, false), sizedSnapshot("a3", "va", 100, true),
		sizedSnapshot("b1", "vb", 5, false), sizedSnapshot("o1", "vo", 1000, false), sizedSnapshot("x1", "vx", 7, false),
		fixture.Volume(func(v *v1beta1.Volume) { v.Name, v.Status.RemovedSnapshotsSize = "va", quotaWorldRemoved })}
	kube = []runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0), fixture.Lease("node-3", 0),
		quotaPV(types.CSIDriverName, "va", "apps", "a"), quotaPVC("apps", "a", "pv-va"),
		quotaPV(types.CSIDriverName, "vb", "apps", "b"), quotaPVC("apps", "b", "pv-vb"),
		quotaPV(types.CSIDriverName, "vo", "other", "o"), quotaPVC("other", "o", "pv-vo"),
		quotaPV("other.csi.example.com", "vx", "apps", "x"), quotaPVC("apps", "x", "pv-vx")}
	vms = []*unstructured.Unstructured{testVM("apps", "vm1", "a", "b"), testVM("apps", "vm2", "b", "x"),
		testVM("apps", "idle", "nothing"), testVM("other", "vm9", "o")}
	return strata, kube, vms
}

func TestSyncResourceQuota(t *testing.T) {
	me := kit.ResponsibleNode(quotaKey, "", "", []string{"node-1", "node-2", "node-3"})
	notMe := "node-1"
	if me == notMe {
		notMe = "node-2"
	}
	usage := func(ns int64, vms map[string]int64) func(*testing.T, *dstest.Env) {
		return func(t *testing.T, env *dstest.Env) {
			rq, err := env.Strata.StrataV1beta1().ResourceQuotas("apps").Get(context.Background(), v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
			require.NoError(t, err)
			want := testQuota(withUsage(ns, vms)).Status.SnapshotLimitStatus
			assert.True(t, sameUsage(want, rq.Status.SnapshotLimitStatus), "usage %+v, want %+v", rq.Status.SnapshotLimitStatus, want)
		}
	}
	cases := []struct {
		name       string
		quota      *v1beta1.ResourceQuota
		noVMs      bool
		me         string
		apiErr     *fixture.ReactorError
		wantErr    string
		wantWrites []string
		check      func(*testing.T, *dstest.Env)
	}{
		{name: "namespace and VM totals: deleted snapshots' data still on disk counted, other namespaces and other drivers left out",
			quota:      testQuota(),
			wantWrites: []string{"update resourcequotas/status default-resource-quota"},
			check:      usage(75, map[string]int64{"vm1": 75, "vm2": 5})},
		{name: "a VM with a quota of its own but no Strata volume shows 0",
			quota: testQuota(func(rq *v1beta1.ResourceQuota) {
				rq.Spec.SnapshotLimit.VMTotalSnapshotSizeQuota = map[string]resource.Quantity{"idle": resource.MustParse("1Gi")}
			}),
			wantWrites: []string{"update resourcequotas/status default-resource-quota"},
			check:      usage(75, map[string]int64{"vm1": 75, "vm2": 5, "idle": 0})},
		{name: "without KubeVirt only the namespace total", quota: testQuota(), noVMs: true,
			wantWrites: []string{"update resourcequotas/status default-resource-quota"},
			check:      usage(75, nil)},
		{name: "status already right: no write",
			quota: testQuota(withUsage(75, map[string]int64{"vm1": 75, "vm2": 5}))},
		{name: "another manager keeps it", quota: testQuota(), me: notMe},
		{name: "no quota in the namespace: nothing to keep"},
		{name: "a failed status write is retried", quota: testQuota(),
			apiErr:     &fixture.ReactorError{Verb: "update", Resource: "resourcequotas", Subresource: "status", Err: errors.New("etcd is down")},
			wantErr:    "etcd is down",
			wantWrites: []string{"update resourcequotas/status default-resource-quota"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			strata, kube, vms := quotaWorld()
			if tc.quota != nil {
				strata = append(strata, tc.quota)
			}
			var env *dstest.Env
			if tc.noVMs {
				env = dstest.New(t, strata, kube)
			} else {
				env = dstest.NewWithVMs(t, strata, kube, vms...)
			}
			if tc.apiErr != nil {
				tc.apiErr.Install(env.Strata)
			}
			c, err := NewResourceQuotaController(logrus.New(), env.DS, record.NewFakeRecorder(10), cmp.Or(tc.me, me))
			require.NoError(t, err)
			env.ClearActions()
			err = c.syncResourceQuota(context.Background(), quotaKey)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()))
			if tc.check != nil {
				tc.check(t, env)
			}
		})
	}
}
