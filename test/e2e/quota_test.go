package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

const mib = int64(1) << 20

func mustQuantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// Seed snapshot-space-management, test plan 2 (sizes in Mi): a VM with a
// 10Mi and a 20Mi disk, both written full before each backup. Two backups
// are taken while the VM has no quota; with a 30Mi VM quota the third —
// as a VirtualMachineBackup, a VirtualMachineSnapshot or a VolumeSnapshot
// of one of its disks — is denied; once the first two are deleted a backup
// is allowed again. The usage shown is the engines' own figure each time.
func TestQuotaVMBackupsAgainstVMQuota(t *testing.T) {
	t.Parallel() // a namespace of its own, no fault: waits beside the others at the end
	installVMKinds(t)
	wns := workloadNamespace(t)
	diskA, diskB := claimVolume(t, wns, "disk-a", "10Mi"), claimVolume(t, wns, "disk-b", "20Mi")
	createVM(t, wns, "vm1", "disk-a", "disk-b")
	epA, epB := attachForWrites(t, diskA), attachForWrites(t, diskB)
	fillDisks := func(pattern int) {
		fill(t, diskA, epA, 10*mib, pattern)
		fill(t, diskB, epB, 20*mib, pattern)
	}
	setQuota(t, wns, func(*v1beta1.SnapshotLimit) {}) // usage shown, nothing limited

	fillDisks(1)
	takeVMBackup(t, wns, "b1", "vm1", "disk-a", "disk-b")
	waitUsageIs(t, 30*mib, wns, "vm1", diskA, diskB)
	fillDisks(2)
	takeVMBackup(t, wns, "b2", "vm1", "disk-a", "disk-b")
	waitUsageIs(t, 60*mib, wns, "vm1", diskA, diskB)
	waitUsageIs(t, 60*mib, wns, "", diskA, diskB) // the namespace holds the VM's disks alone

	setQuota(t, wns, func(l *v1beta1.SnapshotLimit) {
		l.VMTotalSnapshotSizeQuota = map[string]resource.Quantity{"vm1": resource.MustParse("30Mi")}
	})
	fillDisks(3)
	_, err := vmRequest(gvrVMBackup, "VirtualMachineBackup", wns, "b3", "vm1")
	requireQuotaDenial(t, err, "VirtualMachine "+wns+"/vm1", "hold 60Mi", "VirtualMachineBackup "+wns+"/b3 would add 30Mi",
		"quota of 30Mi", "vmTotalSnapshotSizeQuota[vm1]")
	_, err = vmRequest(gvrVMSnapshot, "VirtualMachineSnapshot", wns, "s3", "vm1")
	requireQuotaDenial(t, err, "VirtualMachine "+wns+"/vm1", "VirtualMachineSnapshot "+wns+"/s3 would add 30Mi")
	_, err = volumeSnapshot(wns, "vs3", "disk-a", nil)
	requireQuotaDenial(t, err, "VirtualMachine "+wns+"/vm1", "VolumeSnapshot "+wns+"/vs3 would add 10Mi")

	deleteVMBackup(t, wns, "b1", "disk-a", "disk-b")
	deleteVMBackup(t, wns, "b2", "disk-a", "disk-b")
	waitUsageIs(t, 0, wns, "vm1", diskA, diskB)
	takeVMBackup(t, wns, "b4", "vm1", "disk-a", "disk-b")
	waitUsageIs(t, 30*mib, wns, "vm1", diskA, diskB)

	out := kubectl(t, "get", "srq", "-n", wns)
	// Usage then quota, for the namespace (no quota: blank) and the VMs.
	require.Regexp(t, `default-resource-quota\s+30Mi\s+\{"vm1":"30Mi"\}\s+\{"vm1":"30Mi"\}\s+`, out)
}

// Seed test plan 4: a 10Mi namespace quota and a VM with one 10Mi disk.
// The first backup fits; the second would take the namespace to 20Mi and
// is denied; once the first is deleted a backup fits again.
func TestQuotaNamespaceWithVM(t *testing.T) {
	t.Parallel() // Pods and claims of its own, no fault: waits beside the others at the end
	installVMKinds(t)
	wns := workloadNamespace(t)
	disk := claimVolume(t, wns, "disk", "10Mi")
	createVM(t, wns, "vm1", "disk")
	ep := attachForWrites(t, disk)
	setQuota(t, wns, func(l *v1beta1.SnapshotLimit) { l.NamespaceTotalSnapshotSizeQuota = mustQuantity("10Mi") })

	fill(t, disk, ep, 10*mib, 1)
	takeVMBackup(t, wns, "b1", "vm1", "disk")
	waitUsageIs(t, 10*mib, wns, "", disk)
	fill(t, disk, ep, 10*mib, 2)
	_, err := vmRequest(gvrVMBackup, "VirtualMachineBackup", wns, "b2", "vm1")
	requireQuotaDenial(t, err, "namespace "+wns, "hold 10Mi", "would add 10Mi", "quota of 10Mi",
		"namespaceTotalSnapshotSizeQuota")
	deleteVMBackup(t, wns, "b1", "disk")
	waitUsageIs(t, 0, wns, "", disk)
	b3 := takeVMBackup(t, wns, "b3", "vm1", "disk")
	waitUsageIs(t, 10*mib, wns, "", disk)

	// The namespace is at its quota now. A VolumeSnapshot the backup
	// controller makes for an admitted backup is not charged again; the same
	// snapshot asked for on its own is.
	fill(t, disk, ep, 10*mib, 3)
	_, err = volumeSnapshot(wns, "plain", "disk", nil)
	requireQuotaDenial(t, err, "namespace "+wns, "hold 10Mi", "would add 10Mi")
	_, err = volumeSnapshot(wns, "b3-retry", "disk", &b3)
	require.NoError(t, err, "a VM backup's own VolumeSnapshot was charged at the backup")
	waitVolumeSnapshotReadyIn(t, wns, "b3-retry")
}

// kill -9 of every manager right after a burst of charged snapshots, while
// their sizes and the quota's usage are being written: after the restart
// the usage (rebuilt from nothing in every manager) equals the engines'
// figure, and follows deletes again. In the long tier: make test's quota
// usage is the other quota tests', its manager kills the others'.
func TestLongQuotaUsageAfterManagersKilled(t *testing.T) {
	wns := workloadNamespace(t)
	volume := claimVolume(t, wns, "data", "16Mi")
	ep := attachForWrites(t, volume)
	setQuota(t, wns, func(l *v1beta1.SnapshotLimit) { l.NamespaceTotalSnapshotSizeQuota = mustQuantity("1Gi") })

	names := []string{"k1", "k2", "k3", "k4"}
	t.Cleanup(func() {
		for _, n := range names {
			_ = env.adminStrata.StrataV1beta1().Snapshots(ns).Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	for i, name := range names {
		qemuIO(t, ep, fmt.Sprintf("write -P %d %d %d", i+1, int64(i)*4*mib, 4*mib))
		_, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Create(context.Background(), &v1beta1.Snapshot{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       v1beta1.SnapshotSpec{Volume: volume, CreateSnapshot: true}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for node, mgr := range env.managers {
		require.NoError(t, mgr.Kill(), "kill -9 the manager of %s", node)
	}
	for node, mgr := range env.managers {
		restarted, err := mgr.Restart(env.managerOpts)
		require.NoError(t, err)
		env.managers[node] = restarted
	}
	waitForWebhooks(t)
	waitSnapshotsReady(t, volume, len(names), 2*time.Minute)
	waitUsageIs(t, 16*mib, wns, "", volume) // four 4Mi snapshots

	for _, name := range names[:2] {
		require.NoError(t, env.adminStrata.StrataV1beta1().Snapshots(ns).Delete(context.Background(), name, metav1.DeleteOptions{}))
	}
	// The first two are merged into the third as they go: what they held
	// now counts in it, or is gone with them.
	usage := waitUsage(t, wns, "", volume)
	require.LessOrEqual(t, usage, 16*mib)
	require.GreaterOrEqual(t, usage, 8*mib)
}
