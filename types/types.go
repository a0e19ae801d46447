// Package types holds the names Strata's processes share: labels, the
// finalizer, the namespace, the catalogue of settings, and the snapshot-name
// rule. The data plane (engine/) imports it too, so it must not import
// Kubernetes packages.
package types

const (
	// DefaultNamespace is where every Strata object except ResourceQuota lives.
	DefaultNamespace = "strata-system"

	// FinalizerName holds an object until its controller has cleaned up after it.
	FinalizerName = "strata.io/cleanup"

	LabelVolume       = "strata.io/volume"
	LabelNode         = "strata.io/node"
	LabelDisk         = "strata.io/disk"
	LabelBackingImage = "strata.io/backing-image"
	LabelComponent    = "strata.io/component"
	// LabelSnapshotGroup marks the member snapshots of a SnapshotGroup
	// (CR metadata and the engine's snapshot labels) with the group's name.
	LabelSnapshotGroup = "strata.io/snapshot-group"

	// ComponentNodeLease marks the Leases that carry manager heartbeats.
	ComponentNodeLease = "node-lease"
	// ComponentAPITicket marks the Leases that own the REST API's
	// attachment tickets: a client renews its Lease, and once it lapses
	// the ticket reaper removes the ticket.
	ComponentAPITicket = "api-ticket"
	// LabelRevertingNode marks the ticket Lease of a revert with the node
	// whose manager runs it: a manager that starts runs none, so it
	// releases those of its node at once (api.ReleaseRevertTickets).
	LabelRevertingNode = "strata.io/reverting-node"

	// APIServiceName is the chart's Service in front of the managers'
	// REST API (its names are in every manager's certificate).
	APIServiceName = "strata-api"

	// ManagerServiceAccount is the identity every manager runs as.
	ManagerServiceAccount = "strata-manager"
	// CSIControllerServiceAccount is the identity of the CSI controller
	// plugin and its sidecars (csi-provisioner, csi-attacher, csi-resizer,
	// csi-snapshotter); CSINodeServiceAccount the node plugin's, which has
	// no role: it makes no API call.
	CSIControllerServiceAccount = "strata-csi-controller"
	CSINodeServiceAccount       = "strata-csi-node"

	// BackupCredentialsSecret is the one Secret the shipped Role lets the
	// managers read for a BackupTarget's spec.credentialSecret. A target
	// naming another Secret needs it added to the Role's resourceNames
	// (package/manifests/10-rbac.yaml); until then it reports the Secret
	// as forbidden.
	BackupCredentialsSecret = "strata-backup-credentials"

	// DiskConfigFile is written in every disk directory; it holds the disk's
	// UUID so a disk keeps its identity if its path changes.
	DiskConfigFile = "strata-disk.cfg"
)

// NodeLeaseName is the name of the Lease that carries a node manager's heartbeat.
func NodeLeaseName(nodeName string) string {
	return "strata-node-" + nodeName
}

// CSIDriverName is the CSI driver's name: StorageClasses' provisioner, the
// CSIDriver object and PersistentVolumes' spec.csi.driver. A PV with this
// driver maps a claim to the Strata volume its volumeHandle names.
const CSIDriverName = "driver.strata.io"

// AnnotationCSIName marks an object the CSI driver made, with the name
// CreateVolume or CreateSnapshot was called with. A Snapshot carrying it was
// made for a VolumeSnapshot, which the snapshot quota charged already.
const AnnotationCSIName = "strata.io/csi-name"

// AnnotationRequestedBy names the user whose REST API request wrote the
// object last. A write for a user with a client certificate is made with
// the manager's own rights after the user's access review passed, so the
// API server's audit log names the manager: this annotation and an event
// on the object name the user (docs/security.md "The REST API's writes").
const AnnotationRequestedBy = "strata.io/requested-by"

// The ConfigMap that publishes Strata's CA bundle (key CABundleKey) for
// users' tools (the kubectl plugin, the CSI plugin's REST client) and the
// managers, and the CA that signs now (key SigningCAKey): the CA signer
// writes it.
const (
	CABundleConfigMap = "strata-ca-bundle"
	CABundleKey       = "ca.crt"
	SigningCAKey      = "signing-ca.crt"
)

// The CA signer (strata-manager ca-signer): the one component that holds
// the CA key, under its own ServiceAccount, leading through its Lease.
const (
	SignerServiceAccount = "strata-signer"
	SignerLeaseName      = "strata-ca-signer"
)

// WebhookServiceName is the Service in front of every manager's admission
// webhooks (package mode); their serving certificates name it.
const WebhookServiceName = "strata-webhook"

// The admission webhook configurations: the chart creates them, the
// webhook leader fills them, the CA signer reads their caBundle before it
// lets a new CA sign.
const (
	MutatorConfigName   = "strata-mutator"
	ValidatorConfigName = "strata-validator"
)
