package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	stypes "github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook"
)

var (
	gvrVM             = datastore.KindVirtualMachine.GroupVersionResource
	gvrVMSnapshot     = datastore.KindVirtualMachineSnapshot.GroupVersionResource
	gvrVMBackup       = datastore.KindVirtualMachineBackup.GroupVersionResource
	gvrVolumeSnapshot = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	vmKindsOnce       sync.Once
)

func dynClient() dynamic.Interface { return dynamic.NewForConfigOrDie(env.cluster.AdminConfig) }

// vmKindCRD is a minimal CRD of another project's kind: any fields, as
// KubeVirt and Harvester are not installed here; Strata reads only a few.
func vmKindCRD(k datastore.OptionalKind) string {
	return fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: %s}
spec:
  group: %s
  names: {kind: %s, plural: %s, singular: %s, listKind: %sList}
  scope: Namespaced
  versions:
  - name: %s
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`, k.CRDName(), k.Group, k.Kind, k.Resource, strings.ToLower(k.Kind), k.Kind, k.Version)
}

// installVMKinds installs KubeVirt's VM and VM snapshot and Harvester's VM
// backup kinds, once per run and after the managers started, and waits
// until the webhook judges the two requests: Strata picks kinds installed
// after it up.
func installVMKinds(t *testing.T) {
	t.Helper()
	vmKindsOnce.Do(func() {
		var docs []string
		for _, k := range []datastore.OptionalKind{datastore.KindVirtualMachine, datastore.KindVirtualMachineSnapshot,
			datastore.KindVirtualMachineBackup} {
			docs = append(docs, vmKindCRD(k))
		}
		kubectlApply(t, strings.Join(docs, "---\n"))
		kubectl(t, "wait", "--for", "condition=established", "--timeout", "60s",
			"crd/"+datastore.KindVirtualMachine.CRDName(), "crd/"+datastore.KindVirtualMachineSnapshot.CRDName(),
			"crd/"+datastore.KindVirtualMachineBackup.CRDName())
	})
	require.Eventually(t, func() bool {
		cfg, err := env.adminKube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(
			context.Background(), webhook.ValidatorConfigName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		found := map[string]bool{}
		for _, w := range cfg.Webhooks {
			for _, r := range w.Rules {
				for _, res := range r.Resources {
					found[res] = true
				}
			}
		}
		return found[gvrVMSnapshot.Resource] && found[gvrVMBackup.Resource]
	}, time.Minute, 200*time.Millisecond, "the webhook judges VM snapshots and backups once their CRDs exist")
}

// workloadNamespace makes a namespace for one test's claims and VMs,
// deleted with everything in it when the test ends; the cleanup waits until
// it is gone, its volumes with it.
func workloadNamespace(t *testing.T) string {
	t.Helper()
	name := quotaNamespace(t)
	// Runs before quotaNamespace's own cleanup, which then has nothing to do.
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.adminKube.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
		require.Eventually(t, func() bool {
			_, err := env.adminKube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}, 3*time.Minute, time.Second, "namespace %s and its volumes are gone", name)
	})
	return name
}

// claimVolume creates a claim in namespace, waits for it to bind and
// returns its Strata volume.
func claimVolume(t *testing.T, namespace, name, size string) string {
	t.Helper()
	ctx := context.Background()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	_, err := env.adminKube.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, pvc, metav1.CreateOptions{})
	require.NoError(t, err)
	var volume string
	require.Eventually(t, func() bool {
		got, err := env.adminKube.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || got.Status.Phase != corev1.ClaimBound {
			return false
		}
		pv, err := env.adminKube.CoreV1().PersistentVolumes().Get(ctx, got.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.CSI == nil {
			return false
		}
		volume = pv.Spec.CSI.VolumeHandle
		return true
	}, 2*time.Minute, 200*time.Millisecond, "claim %s/%s bound", namespace, name)
	return volume
}

// attachForWrites attaches the volume to node-1 through a strata-api ticket,
// removed when the test ends (before its namespace goes).
func attachForWrites(t *testing.T, volume string) string {
	t.Helper()
	updateTickets(t, volume, addTicket("quota-test", v1beta1.AttacherTypeStrataAPI, "node-1"))
	t.Cleanup(func() { updateTickets(t, volume, removeTicket("quota-test")) })
	return waitVolume(t, volume, 2*time.Minute, "attached to node-1", attachedTo("node-1")).Status.FrontendEndpoint
}

// fill writes the whole volume with one byte pattern and waits until the
// engine reports a head that large: what the next snapshot would hold.
func fill(t *testing.T, volume, endpoint string, size int64, pattern int) {
	t.Helper()
	qemuIO(t, endpoint, fmt.Sprintf("write -P %d 0 %d", pattern, size))
	qemuIO(t, endpoint, "flush")
	require.Eventually(t, func() bool {
		head := engineChain(t, volume)[stypes.VolumeHeadName]
		return head != nil && head.Size >= size
	}, time.Minute, 200*time.Millisecond, "the engine reports the head of %s full", volume)
}

// engineSnapshotBytes is the independent figure: the sizes of the
// snapshots not removed (never the head) in the engines' own maps.
func engineSnapshotBytes(t *testing.T, volumes ...string) int64 {
	t.Helper()
	var total int64
	for _, v := range volumes {
		for name, s := range engineChain(t, v) {
			if name != stypes.VolumeHeadName && !s.Removed {
				total += s.Size
			}
		}
	}
	return total
}

func getQuota(t *testing.T, namespace string) *v1beta1.ResourceQuota {
	t.Helper()
	rq, err := env.adminStrata.StrataV1beta1().ResourceQuotas(namespace).Get(context.Background(),
		v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
	require.NoError(t, err)
	return rq
}

// setQuota creates or changes the namespace's quota.
func setQuota(t *testing.T, namespace string, edit func(*v1beta1.SnapshotLimit)) {
	t.Helper()
	c := env.adminStrata.StrataV1beta1().ResourceQuotas(namespace)
	require.Eventually(t, func() bool {
		rq, err := c.Get(context.Background(), v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			rq = &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: namespace}}
			edit(&rq.Spec.SnapshotLimit)
			_, err = c.Create(context.Background(), rq, metav1.CreateOptions{})
			return err == nil
		}
		if err != nil {
			return false
		}
		edit(&rq.Spec.SnapshotLimit)
		_, err = c.Update(context.Background(), rq, metav1.UpdateOptions{})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "quota of %s set", namespace)
}

// shownUsage is the usage the quota's status shows for the namespace (vm
// "") or a VM, or -1 while it shows none.
func shownUsage(t *testing.T, namespace, vm string) int64 {
	st := getQuota(t, namespace).Status.SnapshotLimitStatus
	switch {
	case vm == "" && st.NamespaceTotalSnapshotSizeUsage != nil:
		return st.NamespaceTotalSnapshotSizeUsage.Value()
	case vm != "":
		if q, found := st.VMTotalSnapshotSizeUsage[vm]; found {
			return q.Value()
		}
	}
	return -1
}

// waitUsage waits until the quota's status shows, for the namespace (vm
// "") or a VM, the bytes the engines hold for those volumes, and returns it.
func waitUsage(t *testing.T, namespace, vm string, volumes ...string) int64 {
	t.Helper()
	return waitUsageMatching(t, namespace, vm, volumes, "the engines' figure", func(shown, engines int64) bool { return shown == engines })
}

// waitUsageIs waits until the quota's status and the engines both show
// want bytes. Waiting for the two to agree is not enough: right after a
// delete both may still count a snapshot whose purge has not run.
func waitUsageIs(t *testing.T, want int64, namespace, vm string, volumes ...string) {
	t.Helper()
	waitUsageMatching(t, namespace, vm, volumes, fmt.Sprintf("%d bytes on both", want),
		func(shown, engines int64) bool { return shown == want && engines == want })
}

// waitUsageMatching waits until ok holds of the status's usage and the
// engines' bytes, and returns the usage.
func waitUsageMatching(t *testing.T, namespace, vm string, volumes []string, want string, ok func(shown, engines int64) bool) int64 {
	t.Helper()
	var shown, engines int64
	done := assertEventually(func() bool {
		engines = engineSnapshotBytes(t, volumes...)
		shown = shownUsage(t, namespace, vm)
		return shown >= 0 && ok(shown, engines)
	}, time.Minute)
	require.True(t, done, "quota usage of %s %q: want %s; the status shows %d bytes, the engines hold %d", namespace, vm, want, shown, engines)
	return shown
}

func assertEventually(cond func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return cond()
}

// createVM creates a VirtualMachine whose template names the claims.
func createVM(t *testing.T, namespace, name string, claims ...string) {
	t.Helper()
	var volumes []any
	for _, c := range claims {
		volumes = append(volumes, map[string]any{"name": c, "persistentVolumeClaim": map[string]any{"claimName": c}})
	}
	vm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvrVM.GroupVersion().String(), "kind": "VirtualMachine",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec":     map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{"volumes": volumes}}},
	}}
	_, err := dynClient().Resource(gvrVM).Namespace(namespace).Create(context.Background(), vm, metav1.CreateOptions{})
	require.NoError(t, err)
}

// vmRequest creates a VM-level request (a VirtualMachineBackup or a
// VirtualMachineSnapshot) of a VM and returns it, or the admission error.
func vmRequest(gvr schema.GroupVersionResource, kind, namespace, name, vm string) (*unstructured.Unstructured, error) {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec": map[string]any{"type": "backup",
			"source": map[string]any{"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm}},
	}}
	return dynClient().Resource(gvr).Namespace(namespace).Create(context.Background(), obj, metav1.CreateOptions{})
}

// takeVMBackup does what Harvester's backup controller does with an
// admitted VirtualMachineBackup: one VolumeSnapshot per claim, owned by the
// backup, through the real snapshot-controller and CSI sidecars. It waits
// for every snapshot to be ready, and returns the owner reference they carry.
func takeVMBackup(t *testing.T, namespace, name, vm string, claims ...string) metav1.OwnerReference {
	t.Helper()
	backup, err := vmRequest(gvrVMBackup, "VirtualMachineBackup", namespace, name, vm)
	require.NoError(t, err, "VirtualMachineBackup %s", name)
	owner := metav1.OwnerReference{APIVersion: gvrVMBackup.GroupVersion().String(), Kind: "VirtualMachineBackup",
		Name: name, UID: backup.GetUID()}
	for _, c := range claims {
		_, err := volumeSnapshot(namespace, name+"-"+c, c, &owner)
		require.NoError(t, err)
	}
	for _, c := range claims {
		waitVolumeSnapshotReadyIn(t, namespace, name+"-"+c)
	}
	return owner
}

// deleteVMBackup deletes the backup; the garbage collector deletes its
// VolumeSnapshots, and the waits until they are gone.
func deleteVMBackup(t *testing.T, namespace, name string, claims ...string) {
	t.Helper()
	bg := metav1.DeletePropagationBackground
	require.NoError(t, dynClient().Resource(gvrVMBackup).Namespace(namespace).Delete(context.Background(), name,
		metav1.DeleteOptions{PropagationPolicy: &bg}))
	for _, c := range claims {
		waitVolumeSnapshotGone(t, namespace, name+"-"+c)
	}
}

func volumeSnapshot(namespace, name, claim string, owner *metav1.OwnerReference) (*unstructured.Unstructured, error) {
	vs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvrVolumeSnapshot.GroupVersion().String(), "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec":     map[string]any{"volumeSnapshotClassName": "strata", "source": map[string]any{"persistentVolumeClaimName": claim}},
	}}
	if owner != nil {
		vs.SetOwnerReferences([]metav1.OwnerReference{*owner})
	}
	return dynClient().Resource(gvrVolumeSnapshot).Namespace(namespace).Create(context.Background(), vs, metav1.CreateOptions{})
}

func waitVolumeSnapshotReadyIn(t *testing.T, namespace, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		vs, err := dynClient().Resource(gvrVolumeSnapshot).Namespace(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		ready, _, _ := unstructured.NestedBool(vs.Object, "status", "readyToUse")
		return ready
	}, 2*time.Minute, 200*time.Millisecond, "VolumeSnapshot %s/%s readyToUse", namespace, name)
}

func waitVolumeSnapshotGone(t *testing.T, namespace, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := dynClient().Resource(gvrVolumeSnapshot).Namespace(namespace).Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, 200*time.Millisecond, "VolumeSnapshot %s/%s gone", namespace, name)
}

// requireQuotaDenial checks a denial names the scope and the figures.
func requireQuotaDenial(t *testing.T, err error, parts ...string) {
	t.Helper()
	require.Error(t, err, "the request is denied")
	require.True(t, apierrors.IsForbidden(err), "403 Forbidden: %v", err)
	for _, p := range append([]string{"snapshot space quota exceeded"}, parts...) {
		require.Contains(t, err.Error(), p)
	}
}
