package benchscale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// quotaNamespace holds one claim per bench volume, and the quota over them.
const quotaNamespace = "bench-quota"

func claimName(i int) string { return fmt.Sprintf("claim-%04d", i) }

// stepQuota puts every bench volume behind a claim of one namespace (a
// static PV naming the volume, pre-bound to its claim) and gives the
// namespace a snapshot quota. It waits for the quota controller's first
// usage, then times the admission check: dry-run Snapshot creates of
// volumes in the namespace (each summing the usage of all its volumes)
// beside the same requests for volumes no claim uses (the webhook's round
// trip without the quota work). The quiet window that follows holds the
// quota controller too.
func (b *bench) stepQuota(ctx context.Context) error {
	if b.cfg.quotaSamples == 0 {
		b.log.Info("-quota-samples 0: no quota step")
		return nil
	}
	if _, err := b.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: quotaNamespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	start := time.Now()
	if err := parallel(ctx, b.cfg.volumes, b.cfg.workers, b.createClaim); err != nil {
		return err
	}
	// Bound before the quiet window, which would count the binding's writes.
	if _, err := b.waitCount(ctx, "claims bound", b.cfg.volumes, b.countBoundClaims(ctx), func() string { return "" }); err != nil {
		return err
	}
	b.info(fmt.Sprintf("create and bind %d claims with static PVs of the volumes", b.cfg.volumes), fmtDur(time.Since(start)))

	nsQuota := resource.MustParse("1Pi")
	rq := &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: quotaNamespace},
		Spec: v1beta1.ResourceQuotaSpec{SnapshotLimit: v1beta1.SnapshotLimit{NamespaceTotalSnapshotSizeQuota: &nsQuota}}}
	start = time.Now()
	if _, err := b.strata.StrataV1beta1().ResourceQuotas(quotaNamespace).Create(ctx, rq, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		return err
	}
	if _, err := b.waitCount(ctx, "quota usage reported", 1, func() int {
		got, err := b.strata.StrataV1beta1().ResourceQuotas(quotaNamespace).Get(ctx, rq.Name, metav1.GetOptions{})
		if err != nil || got.Status.SnapshotLimitStatus.NamespaceTotalSnapshotSizeUsage == nil {
			return 0
		}
		return 1
	}, func() string { return "no usage in status yet" }); err != nil {
		return err
	}
	b.info(fmt.Sprintf("quota usage over %d volumes first reported", b.cfg.volumes), fmtDur(time.Since(start)))

	charged, err := b.timeDryRunSnapshots(ctx, func(int) string { return volumeName(rand.IntN(b.cfg.volumes)) })
	if err != nil {
		return err
	}
	// The clones have no claim: their snapshots cost the webhook's round
	// trip alone.
	free := []time.Duration{0}
	if clones := min(b.cfg.clones, b.cfg.volumes); clones > 0 && b.cfg.snapshots > 0 {
		if free, err = b.timeDryRunSnapshots(ctx, func(i int) string { return cloneName(i % clones) }); err != nil {
			return err
		}
	}
	n := b.cfg.quotaSamples
	b.log.WithFields(logrus.Fields{"samples": n, "p50": fmtDur(percentile(charged, 0.5)), "p99": fmtDur(percentile(charged, 0.99)),
		"baselineP50": fmtDur(percentile(free, 0.5)), "baselineP99": fmtDur(percentile(free, 0.99))}).Info("snapshot admission")
	b.info(fmt.Sprintf("Snapshot admission with the quota check p50 (%d dry runs, %d volumes in the namespace)", n, b.cfg.volumes),
		fmtDur(percentile(charged, 0.5)))
	b.check("Snapshot admission with the quota check p99", fmtDur(percentile(charged, 0.99)), "≤ 50ms",
		percentile(charged, 0.99) <= 50*time.Millisecond)
	b.info("  … baseline: the same request, no quota (p50 / p99)",
		fmtDur(percentile(free, 0.5))+" / "+fmtDur(percentile(free, 0.99)))
	return nil
}

// createClaim makes the static PV of bench volume i and its claim.
func (b *bench) createClaim(ctx context.Context, i int) error {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + volumeName(i)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: b.cfg.size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: types.CSIDriverName, VolumeHandle: volumeName(i)}},
			ClaimRef: &corev1.ObjectReference{Namespace: quotaNamespace, Name: claimName(i)},
		}}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claimName(i), Namespace: quotaNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv.Name, StorageClassName: new(string),
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: b.cfg.size}}}}
	return retry(ctx, "create claim "+pvc.Name, func() error {
		if _, err := b.kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		_, err := b.kube.CoreV1().PersistentVolumeClaims(quotaNamespace).Create(ctx, pvc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// timeDryRunSnapshots sends -quota-samples dry-run Snapshot creates, one at
// a time, and returns their sorted latencies. A dry run is admitted like a
// real request and stores nothing.
func (b *bench) timeDryRunSnapshots(ctx context.Context, volume func(i int) string) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, b.cfg.quotaSamples)
	for i := range b.cfg.quotaSamples {
		snap := &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-dry-%04d", i), Namespace: ns},
			Spec: v1beta1.SnapshotSpec{Volume: volume(i), CreateSnapshot: true}}
		start := time.Now()
		_, err := b.strata.StrataV1beta1().Snapshots(ns).Create(ctx, snap, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return nil, fmt.Errorf("dry-run snapshot of %s: %w", snap.Spec.Volume, err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	return lat, nil
}

func (b *bench) countBoundClaims(ctx context.Context) func() int {
	return func() int {
		list, err := b.kube.CoreV1().PersistentVolumeClaims(quotaNamespace).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return 0
		}
		n := 0
		for _, c := range list.Items {
			if c.Status.Phase == corev1.ClaimBound {
				n++
			}
		}
		return n
	}
}
