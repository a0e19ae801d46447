package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Per-object series, read from the caches at scrape time: a scrape costs
// no API call, no workqueue add and no gRPC, and each object is reported
// by the one manager responsible for it (so the cluster's managers sum to
// one series per object). Labels name objects people act on (volumes,
// namespaces, VMs, backing images), never snapshots or replicas: the
// series count grows with the volumes, not with their history.

var (
	descVolumeSize = prometheus.NewDesc("strata_volume_size_bytes",
		"The volume's size (spec.size).", []string{"volume"}, nil)
	descVolumeActual = prometheus.NewDesc("strata_volume_actual_size_bytes",
		"The space the volume's data takes on one replica.", []string{"volume"}, nil)
	descVolumeSpace = prometheus.NewDesc("strata_volume_space_bytes",
		"The volume's actual size on one replica by layer kind: the live head, snapshots, "+
			"and removed snapshots still in the chain.", []string{"volume", "kind"}, nil)
	descVolumeSnapshots = prometheus.NewDesc("strata_volume_snapshots",
		"The volume's snapshots (Snapshot CRs).", []string{"volume"}, nil)
	descVolumeSnapshotBytes = prometheus.NewDesc("strata_volume_snapshot_bytes",
		"The sum of the sizes of the volume's snapshots.", []string{"volume"}, nil)
	descVolumeRobustness = prometheus.NewDesc("strata_volume_robustness",
		"1 for the volume's robustness (healthy, degraded, faulted, unknown), 0 for the others.", []string{"volume", "robustness"}, nil)
	descVolumeRebuild = prometheus.NewDesc("strata_volume_rebuild_progress_percent",
		"The least progress of the volume's replicas being rebuilt; absent when none is.", []string{"volume"}, nil)
	descVolumeClone = prometheus.NewDesc("strata_volume_clone_progress_percent",
		"How much of the clone's source is copied; absent for a volume not cloned.", []string{"volume"}, nil)
	descVolumeRestore = prometheus.NewDesc("strata_volume_restore_progress_percent",
		"How much of the backup is restored; absent for a volume not restored.", []string{"volume"}, nil)
	descQuotaUsage = prometheus.NewDesc("strata_quota_snapshot_usage_bytes",
		"Snapshot space a namespace (vm=\"\") or a VM uses, as its ResourceQuota shows.", []string{"namespace", "vm"}, nil)
	descQuotaLimit = prometheus.NewDesc("strata_quota_snapshot_limit_bytes",
		"Snapshot space quota of a namespace (vm=\"\") or a VM.", []string{"namespace", "vm"}, nil)
	descImageCopies = prometheus.NewDesc("strata_backing_image_copies",
		"A backing image's copies on disks, by state.", []string{"backing_image", "state"}, nil)
	descBackups = prometheus.NewDesc("strata_backups",
		"Backups by state.", []string{"state"}, nil)
	descBackupBytes = prometheus.NewDesc("strata_backup_completed_bytes",
		"The sizes of the completed backups, summed.", nil, nil)
)

var robustnesses = []v1beta1.VolumeRobustness{v1beta1.VolumeRobustnessHealthy, v1beta1.VolumeRobustnessDegraded,
	v1beta1.VolumeRobustnessFaulted, v1beta1.VolumeRobustnessUnknown}

// MetricsCollector reports the objects this manager is responsible for.
type MetricsCollector struct {
	ds *datastore.DataStore
	me string
}

// NewMetricsCollector is the collector of the manager of node me.
func NewMetricsCollector(ds *datastore.DataStore, me string) *MetricsCollector {
	return &MetricsCollector{ds: ds, me: me}
}

func (m *MetricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descVolumeSize, descVolumeActual, descVolumeSpace, descVolumeSnapshots, descVolumeSnapshotBytes,
		descVolumeRobustness, descVolumeRebuild, descVolumeClone, descVolumeRestore, descQuotaUsage, descQuotaLimit,
		descImageCopies, descBackups, descBackupBytes} {
		ch <- d
	}
}

func (m *MetricsCollector) Collect(ch chan<- prometheus.Metric) {
	alive, err := m.ds.AliveNodeNames()
	if err != nil {
		return
	}
	mine := func(namespace, name, owner string) bool {
		return kit.ResponsibleNode(namespace+"/"+name, owner, "", alive) == m.me
	}
	m.collectVolumes(ch, mine)
	m.collectQuotas(ch, mine)
	m.collectImagesAndBackups(ch, mine)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func (m *MetricsCollector) collectVolumes(ch chan<- prometheus.Metric, mine func(ns, name, owner string) bool) {
	vols, _ := m.ds.Volumes.ListRO(nil)
	for _, v := range vols {
		if !mine(v.Namespace, v.Name, v.Status.OwnerID) {
			continue
		}
		gauge(ch, descVolumeSize, float64(v.Spec.Size.Value()), v.Name)
		gauge(ch, descVolumeActual, float64(v.Status.ActualSize), v.Name)
		gauge(ch, descVolumeSpace, float64(v.Status.HeadSize), v.Name, "head")
		gauge(ch, descVolumeSpace, float64(v.Status.SnapshotsSize), v.Name, "snapshots")
		gauge(ch, descVolumeSpace, float64(v.Status.RemovedSnapshotsSize), v.Name, "removed")
		snaps, _ := m.ds.Snapshots.ListByIndexRO(datastore.IndexByVolume, v.Name)
		var bytes int64
		for _, s := range snaps {
			bytes += s.Status.Size
		}
		gauge(ch, descVolumeSnapshots, float64(len(snaps)), v.Name)
		gauge(ch, descVolumeSnapshotBytes, float64(bytes), v.Name)
		for _, r := range robustnesses {
			value := 0.0
			if v.Status.Robustness == r {
				value = 1
			}
			gauge(ch, descVolumeRobustness, value, v.Name, string(r))
		}
		if p, ok := m.rebuildProgress(v.Name); ok {
			gauge(ch, descVolumeRebuild, float64(p), v.Name)
		}
		if v.Status.CloneStatus != nil {
			gauge(ch, descVolumeClone, float64(v.Status.CloneStatus.Progress), v.Name)
		}
		if v.Status.RestoreStatus != nil {
			gauge(ch, descVolumeRestore, float64(v.Status.RestoreStatus.Progress), v.Name)
		}
	}
}

// rebuildProgress is the least progress of the volume's rebuilds.
func (m *MetricsCollector) rebuildProgress(volume string) (int32, bool) {
	engines, _ := m.ds.Engines.ListByIndexRO(datastore.IndexByVolume, volume)
	least, rebuilding := int32(100), false
	for _, e := range engines {
		for _, r := range e.Status.RebuildStatus {
			if r != nil && r.IsRebuilding {
				least, rebuilding = min(least, r.Progress), true
			}
		}
	}
	return least, rebuilding
}

func (m *MetricsCollector) collectQuotas(ch chan<- prometheus.Metric, mine func(ns, name, owner string) bool) {
	quotas, _ := m.ds.ResourceQuotas.ListRO(nil)
	for _, rq := range quotas {
		if rq.Name != v1beta1.DefaultResourceQuotaName || !mine(rq.Namespace, rq.Name, "") {
			continue
		}
		limit, st := rq.Spec.SnapshotLimit, rq.Status.SnapshotLimitStatus
		if q := st.NamespaceTotalSnapshotSizeUsage; q != nil {
			gauge(ch, descQuotaUsage, float64(q.Value()), rq.Namespace, "")
		}
		if q := limit.NamespaceTotalSnapshotSizeQuota; q != nil {
			gauge(ch, descQuotaLimit, float64(q.Value()), rq.Namespace, "")
		}
		for vm, q := range st.VMTotalSnapshotSizeUsage {
			gauge(ch, descQuotaUsage, float64(q.Value()), rq.Namespace, vm)
		}
		for vm, q := range limit.VMTotalSnapshotSizeQuota {
			gauge(ch, descQuotaLimit, float64(q.Value()), rq.Namespace, vm)
		}
	}
}

func (m *MetricsCollector) collectImagesAndBackups(ch chan<- prometheus.Metric, mine func(ns, name, owner string) bool) {
	images, _ := m.ds.BackingImages.ListRO(nil)
	for _, bi := range images {
		if !mine(bi.Namespace, bi.Name, bi.Status.OwnerID) {
			continue
		}
		byState := map[v1beta1.BackingImageState]int{}
		for _, f := range bi.Status.DiskFileStatusMap {
			if f != nil {
				byState[f.State]++
			}
		}
		for state, n := range byState {
			gauge(ch, descImageCopies, float64(n), bi.Name, string(state))
		}
	}
	backups, _ := m.ds.Backups.ListRO(nil)
	byState := map[v1beta1.BackupState]int{}
	var completed int64
	for _, b := range backups {
		if !mine(b.Namespace, b.Name, b.Status.OwnerID) {
			continue
		}
		byState[b.Status.State]++
		if b.Status.State == v1beta1.BackupStateCompleted {
			completed += b.Status.Size
		}
	}
	for state, n := range byState {
		gauge(ch, descBackups, float64(n), string(state))
	}
	gauge(ch, descBackupBytes, float64(completed))
}
