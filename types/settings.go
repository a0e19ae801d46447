package types

import (
	"fmt"
	"sort"
	"strconv"
)

// SettingName names one Setting CR.
type SettingName string

const (
	SettingDefaultReplicaCount                 SettingName = "default-replica-count"
	SettingSnapshotMaxCount                    SettingName = "snapshot-max-count"
	SettingDisableSnapshotPurge                SettingName = "disable-snapshot-purge"
	SettingBackupTarget                        SettingName = "backup-target"
	SettingBackingImageCleanupWaitInterval     SettingName = "backing-image-cleanup-wait-interval"
	SettingBackingImageMaxVirtualSize          SettingName = "backing-image-max-virtual-size"
	SettingBackingImageDownloadMaxSize         SettingName = "backing-image-download-max-size"
	SettingBackingImageDownloadAllowedNetworks SettingName = "backing-image-download-allowed-networks"
	SettingReplicaReplenishmentWaitInterval    SettingName = "replica-replenishment-wait-interval"
	SettingReplicaSoftAntiAffinity             SettingName = "replica-soft-anti-affinity"
	SettingStorageOverProvisioningPercentage   SettingName = "storage-over-provisioning-percentage"
	SettingStorageMinimalAvailablePercentage   SettingName = "storage-minimal-available-percentage"
	SettingOrphanedDataAutoDeletion            SettingName = "orphaned-data-auto-deletion"
	SettingBackupGCInterval                    SettingName = "backup-gc-interval"
	SettingBackupGCGrace                       SettingName = "backup-gc-grace"
	SettingFreezeFilesystemForSnapshot         SettingName = "freeze-filesystem-for-snapshot"
	SettingFreezeFilesystemTimeout             SettingName = "freeze-filesystem-timeout"
)

// SettingType says how a setting's value string is parsed.
type SettingType string

const (
	SettingTypeInt    SettingType = "int"
	SettingTypeBool   SettingType = "bool"
	SettingTypeString SettingType = "string"
	// SettingTypeNetworks is a comma-separated list of CIDRs, IP addresses
	// and host names (ParseNetworks).
	SettingTypeNetworks SettingType = "networks"
)

// SettingDefinition describes one setting: its meaning, type, default and range.
type SettingDefinition struct {
	Description string
	Type        SettingType
	Default     string
	// Min and Max bound an int setting (inclusive).
	Min, Max int64
}

// SettingDefinitions is the catalogue of every setting Strata knows.
var SettingDefinitions = map[SettingName]SettingDefinition{
	SettingDefaultReplicaCount: {
		Description: "Replicas a volume gets when it does not say.",
		Type:        SettingTypeInt, Default: "3", Min: 1, Max: 20,
	},
	SettingSnapshotMaxCount: {
		Description: "snapshotMaxCount a new volume gets when it does not say: the most user snapshots its chain may hold.",
		Type:        SettingTypeInt, Default: "250", Min: 2, Max: 250,
	},
	SettingDisableSnapshotPurge: {
		Description: "Stops purges of removed snapshots, for example during maintenance.",
		Type:        SettingTypeBool, Default: "false",
	},
	SettingBackupTarget: {
		Description: "URL of the backup store; empty disables backups.",
		Type:        SettingTypeString, Default: "",
	},
	SettingBackingImageCleanupWaitInterval: {
		Description: "Minutes a backing image copy may stay unused on a disk before it is removed.",
		Type:        SettingTypeInt, Default: "60", Min: 0, Max: 1 << 20,
	},
	// The three below bound what a backing image from outside may cost a
	// node (issue 24): a small download that unpacks to terabytes, a URL
	// that leads to the node's own services or the cloud metadata endpoint.
	SettingBackingImageMaxVirtualSize: {
		Description: "GiB: the largest backing image (its virtual size: a qcow2's disk size, a raw or decompressed image's " +
			"bytes) a download or upload may give; a larger one, or a gzip/xz stream that decompresses past it, fails for good.",
		Type: SettingTypeInt, Default: "1024", Min: 1, Max: 16384,
	},
	SettingBackingImageDownloadMaxSize: {
		Description: "GiB: the most bytes a backing image download may bring (before decompression); a larger source fails for good.",
		Type:        SettingTypeInt, Default: "256", Min: 1, Max: 16384,
	},
	// Issue 46: a download refused only loopback and link-local, so a URL
	// could reach the cluster's Services and Pods, the nodes' own ports and
	// the metadata endpoints outside 169.254/16.
	SettingBackingImageDownloadAllowedNetworks: {
		Description: "Comma-separated CIDRs, IP addresses and host names that backing image downloads may connect to " +
			"although they are refused by default: loopback, link-local, private (RFC 1918), shared (100.64.0.0/10), " +
			"unique-local (fc00::/7) and multicast addresses, the nodes' addresses, and the cluster's Pod and Service " +
			"ranges. A host name admits any address it resolves to, so it trusts that name's DNS. Checked at each " +
			"connection, after DNS resolution and at every redirect.",
		Type: SettingTypeNetworks, Default: "",
	},
	SettingReplicaReplenishmentWaitInterval: {
		Description: "Seconds to wait for a failed replica to come back before a new one replaces it.",
		Type:        SettingTypeInt, Default: "600", Min: 0, Max: 1 << 20,
	},
	SettingReplicaSoftAntiAffinity: {
		Description: "Allows two replicas of a volume on one node when no other node fits.",
		Type:        SettingTypeBool, Default: "false",
	},
	SettingStorageOverProvisioningPercentage: {
		Description: "Percent of a disk's usable space that replicas may be scheduled for, counting their full sizes.",
		Type:        SettingTypeInt, Default: "100", Min: 0, Max: 1000,
	},
	SettingStorageMinimalAvailablePercentage: {
		Description: "A disk with less free space than this percent takes no new replica.",
		Type:        SettingTypeInt, Default: "25", Min: 0, Max: 100,
	},
	SettingOrphanedDataAutoDeletion: {
		Description: "Deletes replica data no replica names any more (left while its node or instance manager was down) " +
			"once the instance manager is back; false keeps it, listed in the node's disk status, for manual recovery.",
		Type: SettingTypeBool, Default: "true",
	},
	SettingBackupGCInterval: {
		Description: "Minutes between garbage collections of a backup target's unreferenced packs (orphans of crashed " +
			"backups, data of deleted ones); 0 runs one only after a Backup is deleted.",
		Type: SettingTypeInt, Default: "60", Min: 0, Max: 1 << 20,
	},
	// 60: the inflight marker of a running backup already stops a sweep, so
	// the grace only covers a backup whose marker refreshes all failed; an
	// hour matches the age at which GC takes a marker for a crashed backup's.
	// Issue 43: a snapshot cut at the block device missed what was still in
	// the node's page cache (the README's own example restored no file).
	SettingFreezeFilesystemForSnapshot: {
		Description: "Cuts every snapshot of a volume staged with a filesystem inside a freeze of that filesystem " +
			"(FIFREEZE on its node: what the application wrote is in the snapshot); a raw block volume's page cache " +
			"is flushed first. A volume's spec.freezeFilesystemForSnapshot (enabled, disabled) overrides it.",
		Type: SettingTypeBool, Default: "true",
	},
	SettingFreezeFilesystemTimeout: {
		Description: "Seconds a filesystem may take to freeze and stay frozen for one snapshot (all of a group's members " +
			"together); past it the filesystem is thawed and the snapshot fails with the reason.",
		Type: SettingTypeInt, Default: "10", Min: 1, Max: 60,
	},
	SettingBackupGCGrace: {
		Description: "Minutes an unreferenced pack is kept after its upload before garbage collection may delete it; " +
			"0 leaves running backups protected by their inflight markers alone.",
		Type: SettingTypeInt, Default: "60", Min: 0, Max: 1 << 20,
	},
}

// SettingNames lists every known setting, sorted.
func SettingNames() []SettingName {
	names := make([]SettingName, 0, len(SettingDefinitions))
	for n := range SettingDefinitions {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	return names
}

// ValidateSetting checks a value against its setting's definition and says
// what is wrong in terms a user can act on.
func ValidateSetting(name SettingName, value string) error {
	def, ok := SettingDefinitions[name]
	if !ok {
		return fmt.Errorf("unknown setting %q", name)
	}
	switch def.Type {
	case SettingTypeInt:
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return fmt.Errorf("setting %s: value %q is not an integer", name, value)
		}
		if n < def.Min || n > def.Max {
			return fmt.Errorf("setting %s: value %d is outside [%d, %d]", name, n, def.Min, def.Max)
		}
	case SettingTypeBool:
		if _, err := strconv.ParseBool(value); err != nil {
			return fmt.Errorf("setting %s: value %q is not true or false", name, value)
		}
	case SettingTypeNetworks:
		if _, err := ParseNetworks(value); err != nil {
			return fmt.Errorf("setting %s: %w", name, err)
		}
	}
	return nil
}
