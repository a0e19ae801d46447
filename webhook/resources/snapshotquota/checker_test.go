package snapshotquota

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

const mi = int64(1) << 20

func engine(volume string, head int64) *v1beta1.Engine {
	return &v1beta1.Engine{ObjectMeta: metav1.ObjectMeta{Name: volume + "-e-0", Namespace: types.DefaultNamespace},
		Spec:   v1beta1.EngineSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: volume}},
		Status: v1beta1.EngineStatus{Snapshots: map[string]*v1beta1.SnapshotInfo{types.VolumeHeadName: {Size: head}}}}
}

func snap(name, volume string, size int64) *v1beta1.Snapshot {
	return &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
		Spec: v1beta1.SnapshotSpec{Volume: volume}, Status: v1beta1.SnapshotStatus{Size: size}}
}

func claim(name, volume string) []runtime.Object {
	uid := k8stypes.UID("uid-" + name)
	return []runtime.Object{
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + volume}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: types.CSIDriverName, VolumeHandle: volume}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "apps", Name: name, UID: uid}}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps", UID: uid},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-" + volume}},
	}
}

func vm(name string, claims ...string) *unstructured.Unstructured {
	var volumes []any
	for _, c := range claims {
		volumes = append(volumes, map[string]any{"name": c, "dataVolume": map[string]any{"name": c}})
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": name, "namespace": "apps"},
		"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{"volumes": volumes}}}}}
}

func quota(ns string, vms map[string]string) *v1beta1.ResourceQuota {
	rq := &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: "apps"}}
	if ns != "" {
		q := resource.MustParse(ns)
		rq.Spec.SnapshotLimit.NamespaceTotalSnapshotSizeQuota = &q
	}
	for name, q := range vms {
		if rq.Spec.SnapshotLimit.VMTotalSnapshotSizeQuota == nil {
			rq.Spec.SnapshotLimit.VMTotalSnapshotSizeQuota = map[string]resource.Quantity{}
		}
		rq.Spec.SnapshotLimit.VMTotalSnapshotSizeQuota[name] = resource.MustParse(q)
	}
	return rq
}

// The world: VM vm1 has disks a (volume va: snapshots 10Mi, head 10Mi) and
// b (vb: 20Mi, head 20Mi); claim c (vc: 5Mi, head 1Mi) belongs to no VM.
func TestCheck(t *testing.T) {
	cases := []struct {
		name    string
		quota   *v1beta1.ResourceQuota
		charge  Charge
		wantErr []string // parts of the denial; nil: allowed
	}{
		{name: "no quota: unlimited", charge: Charge{What: "VirtualMachineBackup apps/b", Namespace: "apps", Volumes: []string{"va", "vb"}, VM: "vm1"}},
		{name: "zero quotas: unlimited", quota: quota("0", map[string]string{"vm1": "0"}),
			charge: Charge{What: "x", Namespace: "apps", Volumes: []string{"va", "vb"}, VM: "vm1"}},
		{name: "VM backup fits its VM quota exactly", quota: quota("", map[string]string{"vm1": "60Mi"}),
			charge: Charge{What: "x", Namespace: "apps", Volumes: []string{"va", "vb"}, VM: "vm1"}},
		{name: "VM backup over its VM quota", quota: quota("", map[string]string{"vm1": "59Mi"}),
			charge: Charge{What: "VirtualMachineBackup apps/b3", Namespace: "apps", Volumes: []string{"va", "vb"}, VM: "vm1"},
			wantErr: []string{"VirtualMachine apps/vm1 hold 30Mi", "VirtualMachineBackup apps/b3 would add 30Mi",
				"volumes va, vb", "quota of 59Mi", "vmTotalSnapshotSizeQuota[vm1]"}},
		{name: "a VolumeSnapshot of a VM's disk counts against the VM", quota: quota("", map[string]string{"vm1": "35Mi"}),
			charge:  Charge{What: "VolumeSnapshot apps/s", Namespace: "apps", Volumes: []string{"va"}},
			wantErr: []string{"VirtualMachine apps/vm1 hold 30Mi", "would add 10Mi", "quota of 35Mi"}},
		{name: "a claim of no VM: the VM quota does not apply", quota: quota("", map[string]string{"vm1": "1Mi"}),
			charge: Charge{What: "VolumeSnapshot apps/s", Namespace: "apps", Volumes: []string{"vc"}}},
		{name: "namespace quota counts every claim", quota: quota("35Mi", nil),
			charge:  Charge{What: "VolumeSnapshot apps/s", Namespace: "apps", Volumes: []string{"vc"}},
			wantErr: []string{"namespace apps hold 35Mi", "would add 1Mi", "volume vc", "quota of 35Mi", "namespaceTotalSnapshotSizeQuota"}},
		{name: "namespace quota with room", quota: quota("36Mi", nil),
			charge: Charge{What: "x", Namespace: "apps", Volumes: []string{"vc"}}},
		{name: "a VM gone: its usage alone decides", quota: quota("", map[string]string{"ghost": "1Mi"}),
			charge: Charge{What: "x", Namespace: "apps", VM: "ghost"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			strata := []runtime.Object{engine("va", 10*mi), engine("vb", 20*mi), engine("vc", 1*mi),
				snap("a1", "va", 10*mi), snap("b1", "vb", 20*mi), snap("c1", "vc", 5*mi)}
			if tc.quota != nil {
				strata = append(strata, tc.quota)
			}
			var kube []runtime.Object
			for _, c := range [][2]string{{"a", "va"}, {"b", "vb"}, {"c", "vc"}} {
				kube = append(kube, claim(c[0], c[1])...)
			}
			env := dstest.NewWithVMs(t, strata, kube, vm("vm1", "a", "b"))
			err := NewChecker(env.DS).Check(tc.charge)
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			var pe *admission.PolicyError
			require.ErrorAs(t, err, &pe)
			for _, part := range tc.wantErr {
				assert.Contains(t, err.Error(), part)
			}
		})
	}
}
