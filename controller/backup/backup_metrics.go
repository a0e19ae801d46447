package backup

import "github.com/prometheus/client_golang/prometheus"

// Backup series counted as backups end (the manager that ran them).
var (
	BackupDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "strata_backup_duration_seconds",
		Help:    "From a Backup's creation to its completion.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1 s … 2.3 h
	})
	BackupUploadedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "strata_backup_uploaded_bytes_total",
		Help: "Bytes the completed backups uploaded (new data, after deduplication and compression).",
	})
	BackupFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_backup_failures_total",
		Help: "Failed backup attempts: retried (final=\"false\") or given up (final=\"true\").",
	}, []string{"final"})
)
