package v1beta1

// Volume condition types. The controllers set them; tests, the plugin and
// users filter on them, so they live with the API.
const (
	VolumeConditionScheduled = "Scheduled"
	VolumeConditionSalvaged  = "Salvaged"
	// VolumeConditionSnapshotLimit is True when the volume's next user
	// snapshot would be refused, or nearly so.
	VolumeConditionSnapshotLimit = "SnapshotLimit"
	// VolumeConditionSnapshotSpaceRetained is True when removed snapshots
	// hold data a purge would free and purge is disabled.
	VolumeConditionSnapshotSpaceRetained = "SnapshotSpaceRetained"
)

// Reasons of the SnapshotLimit condition, the most pressing first.
const (
	SnapshotLimitReasonCountReached = "CountLimitReached"
	SnapshotLimitReasonSizeReached  = "SizeLimitReached"
	SnapshotLimitReasonCountNear    = "CountLimitNear"
	SnapshotLimitReasonSizeNear     = "SizeLimitNear"
	SnapshotLimitReasonWithin       = "WithinLimits"
)
