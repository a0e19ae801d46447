package e2e

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/strata-storage/strata/internal/devtools/auditcheck"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/types"
)

// Least privilege, proven by the API server's audit log: every request of
// Strata's components (the managers, the CA signer, the CSI controller Pod,
// the CSI node plugins, the snapshot-controller) is logged at level
// Metadata, and after the suite auditCheck fails on any request RBAC
// denied a component and, when the whole suite ran, on any verb a shipped
// role grants that no request used. docs/security.md "Least privilege".

var auditOptions = localcluster.AuditOptions{
	Groups: []string{"system:serviceaccounts:" + types.DefaultNamespace},
	Users: []string{auditcheck.ServiceAccountUser(localcluster.SnapshotControllerNamespace,
		localcluster.SnapshotControllerServiceAccount)},
}

var auditConfig = auditcheck.Config{
	Components: []auditcheck.Component{
		{Name: "strata-manager", Namespace: types.DefaultNamespace, ServiceAccount: types.ManagerServiceAccount},
		{Name: "strata-ca-signer", Namespace: types.DefaultNamespace, ServiceAccount: types.SignerServiceAccount},
		{Name: "strata-csi-controller", Namespace: types.DefaultNamespace, ServiceAccount: types.CSIControllerServiceAccount},
		{Name: "strata-csi-node", Namespace: types.DefaultNamespace, ServiceAccount: types.CSINodeServiceAccount},
		{Name: "snapshot-controller", Namespace: localcluster.SnapshotControllerNamespace,
			ServiceAccount: localcluster.SnapshotControllerServiceAccount},
	},
	// The tests' own clients borrow the manager's token to probe its RBAC
	// (TestManagerRunsUnderShippedRBAC, TestWebhookRBAC) and to ask the CA
	// signer for another node's identity
	// (TestIdentitySignerBindsRequestsToTheTokensNode): what they are
	// refused is the point of those tests.
	IgnoreUserAgents: []string{"e2e.test/"},
	// Grants no request used in the suite, each needed all the same: reads
	// that go to the API server only when a cache is behind, and a repeat.
	Unused: []auditcheck.Allowance{
		{Component: "strata-manager", Verb: "get", Group: "strata.io", Resource: "engines",
			Reason: "an orphaned engine instance's Engine is read live before the instance is stopped (the suite orphans replicas only)"},
		{Component: "strata-manager", Verb: "get", Group: "strata.io", Resource: "backups",
			Reason: "read live only when the cache lags: a ticket's owner Backup (reaper), a fromBackup volume made just after its Backup (webhook)"},
		{Component: "strata-manager", Verb: "get", Group: "storage.k8s.io", Resource: "volumeattachments",
			Reason: "the ticket reaper confirms live that a csi-attacher ticket's VolumeAttachment is gone; csi-attacher removes its tickets first"},
		{Component: "strata-csi-controller", Verb: "get", Group: "strata.io", Resource: "backups",
			Reason: "a restore's Backup is read live only when the plugin's cache does not hold it yet"},
		{Component: "strata-manager", Verb: "list", Resource: "pods",
			Reason: "the instance-manager rollout runs only where instance managers are Pods (the chart; test/deployed), not in this process mode"},
		{Component: "strata-manager", Verb: "watch", Resource: "pods", Reason: "as list pods"},
		{Component: "strata-manager", Verb: "delete", Resource: "pods", Reason: "as list pods"},
		{Component: "strata-manager", Verb: "list", Group: "apps", Resource: "controllerrevisions", Reason: "as list pods"},
		{Component: "strata-manager", Verb: "watch", Group: "apps", Resource: "controllerrevisions", Reason: "as list pods"},
		{Component: "strata-manager", Verb: "delete", Group: "coordination.k8s.io", Resource: "leases",
			Reason: "the REST API's attachment ticket Leases, deleted on detach and when they lapse; test/deployed drives the REST API"},
		{Component: "strata-manager", Verb: "create", Group: "strata.io", Resource: "volumes",
			Reason: "the REST API's writes for users with client certificates, after their access review; test/deployed drives them"},
		{Component: "strata-manager", Verb: "delete", Group: "strata.io", Resource: "volumes", Reason: "as create volumes"},
		{Component: "strata-manager", Verb: "create", Group: "strata.io", Resource: "backingimages", Reason: "as create volumes"},
		{Component: "strata-manager", Verb: "delete", Group: "strata.io", Resource: "backingimages", Reason: "as create volumes"},
		{Component: "strata-manager", Verb: "get", Group: "strata.io", Resource: "resourcequotas", Reason: "as create volumes"},
		{Component: "strata-manager", Verb: "create", Group: "strata.io", Resource: "resourcequotas", Reason: "as create volumes"},
		{Component: "strata-manager", Verb: "update", Group: "strata.io", Resource: "resourcequotas", Reason: "as create volumes"},
		{Component: "strata-manager", Verb: "get", Resource: "configmaps",
			Reason: "Kubernetes' extension-apiserver-authentication-reader Role grants it with list and watch, and the Role grants it on " +
				"strata-ca-bundle with list and watch: the client CA and the trust bundle are watched, not got"},
		{Component: "strata-manager", Verb: "get", Group: "certificates.k8s.io", Resource: "certificatesigningrequests",
			Reason: "client-go's csr helper reads a request back only when one of its name exists already, and the managers' are named " +
				"by the API server (generateName); they wait for theirs with a watch"},
		// The CA signer's: what only a rotation, the chart's sidecar or the
		// API server's own checks use.
		{Component: "strata-ca-signer", Verb: "approve", Group: "certificates.k8s.io", Resource: "signers",
			Reason: "checked by the API server inside the update of certificatesigningrequests/approval, which the audit log records; no request of its own"},
		{Component: "strata-ca-signer", Verb: "sign", Group: "certificates.k8s.io", Resource: "signers",
			Reason: "checked by the API server inside the update of certificatesigningrequests/status, as approve signers"},
		{Component: "strata-ca-signer", Verb: "update", Resource: "secrets",
			Reason: "the signer rewrites the CA Secret (strata-webhook-ca) when it rotates the CA: test/deployed TestCertificateRotationWhileAPodWrites"},
		{Component: "strata-ca-signer", Verb: "get", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations",
			Reason: "read before a rotation's next CA signs, to see it in the caBundle: as update secrets"},
		{Component: "strata-ca-signer", Verb: "get", Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations",
			Reason: "as get validatingwebhookconfigurations"},
		{Component: "strata-ca-signer", Verb: "patch", Resource: "secrets",
			Reason: "the SnapshotMetadata sidecar's certificate (Secret strata-snapshot-metadata-tls): the sidecar runs in the chart only (test/deployed)"},
		{Component: "strata-ca-signer", Verb: "get", Resource: "secrets",
			Reason: "strata-snapshot-metadata-tls, as patch secrets: a new leader reads the sidecar's certificate (the CA Secret's get is used)"},
		{Component: "strata-ca-signer", Verb: "create", Group: "cbt.storage.k8s.io", Resource: "snapshotmetadataservices",
			Reason: "the SnapshotMetadataService is published where the chart runs the sidecar (test/deployed)"},
		{Component: "strata-ca-signer", Verb: "patch", Group: "cbt.storage.k8s.io", Resource: "snapshotmetadataservices",
			Reason: "as create snapshotmetadataservices"},
		{Component: "strata-csi-controller", Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews",
			Reason: "the SnapshotMetadata sidecar checks backup tools' tokens; it runs in the chart only (test/deployed)"},
		{Component: "strata-csi-controller", Verb: "create", Group: "authorization.k8s.io", Resource: "subjectaccessreviews",
			Reason: "as create tokenreviews"},
		{Component: "strata-csi-controller", Verb: "get", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshotclasses",
			Reason: "as create tokenreviews"},
		{Component: "strata-csi-controller", Verb: "get", Group: "cbt.storage.k8s.io", Resource: "snapshotmetadataservices",
			Reason: "as create tokenreviews"},
		{Component: "snapshot-controller", Verb: "patch", Resource: "events",
			Reason: "client-go's event recorder patches an event that repeats (its count); none repeated in the suite"},
		// Flows that moved to test/deployed in issue 44 (docs/testing.md
		// lists the moves): the install's own sidecars use these there.
		{Component: "strata-csi-controller", Verb: "create", Group: "strata.io", Resource: "backingimages",
			Reason: "a StorageClass naming a backing image: test/deployed TestUserFlows/BackingImageClaimAndItsClone"},
		{Component: "strata-csi-controller", Verb: "get", Group: "strata.io", Resource: "backingimages",
			Reason: "as create backingimages"},
		{Component: "strata-csi-controller", Verb: "get", Resource: "persistentvolumes",
			Reason: "csi-provisioner's clone of a claim (dataSource: PVC): test/deployed TestUserFlows/BackingImageClaimAndItsClone"},
		{Component: "strata-csi-controller", Verb: "update", Resource: "persistentvolumeclaims",
			Reason: "csi-provisioner's cloning-protection finalizer on a clone's source claim: as get persistentvolumes"},
		{Component: "strata-csi-controller", Verb: "get", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshotcontents",
			Reason: "VolumeGroupSnapshots: test/deployed TestUserFlows/GroupSnapshotHoldsWhatThePodJustWrote and the long tier's TestLongVolumeGroupSnapshotIsCrashConsistentThroughPods"},
		{Component: "strata-csi-controller", Verb: "patch", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshotcontents",
			Reason: "as get volumegroupsnapshotcontents"},
		{Component: "strata-csi-controller", Verb: "update", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshotcontents/status",
			Reason: "as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "create", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshotcontents",
			Reason: "as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "delete", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshotcontents",
			Reason: "as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "patch", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshotcontents",
			Reason: "as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "get", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshots",
			Reason: "as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "update", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshots",
			Reason: "as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "update", Group: "groupsnapshot.storage.k8s.io", Resource: "volumegroupsnapshots/status",
			Reason: "as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "create", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots",
			Reason: "a VolumeGroupSnapshot's member VolumeSnapshots: as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "delete", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots",
			Reason: "a deleted VolumeGroupSnapshot's members: as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "patch", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots/status",
			Reason: "a member VolumeSnapshot's status: as get volumegroupsnapshotcontents"},
		{Component: "snapshot-controller", Verb: "patch", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshotcontents/status",
			Reason: "a member content's status: as get volumegroupsnapshotcontents"},
		{Component: "strata-csi-controller", Verb: "patch", Resource: "persistentvolumeclaims/status",
			Reason: "csi-resizer records a grown claim's capacity and conditions: test/deployed TestUserFlows/PVCResizeWhilePodRuns"},
		{Component: "strata-csi-controller", Verb: "get", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots",
			Reason: "csi-provisioner reads a claim's dataSource VolumeSnapshot: test/deployed TestUserFlows/TrimFreesADeletedSnapshotsSpace, SnapshotRestoredOnAnotherNode and the other restores"},
		{Component: "strata-csi-controller", Verb: "update", Group: "snapshot.storage.k8s.io", Resource: "volumesnapshots",
			Reason: "csi-provisioner's finalizer on a VolumeSnapshot a claim is restored from: as get volumesnapshots"},
	},
	// Denials the suite causes on purpose.
	Denied: []auditcheck.Allowance{
		{Component: "strata-manager", Verb: "update", Group: "strata.io", Resource: "volumes/status", Name: "e2e-retry",
			Reason: "TestLongFailingKeyConvergesAfterTheFaultClears takes this from the manager's role for a while"},
		{Component: "strata-manager", Verb: "get", Resource: "secrets", Name: forbiddenCredentialSecret,
			Reason: "TestBackupTargetListsAnOldTargetAndReportsAvailability names a Secret the Role does not list"},
	},
}

// auditCheck reads the audit log, writes the full report to reportPath and
// prints the summary. Run with -run (or -skip beyond the long tests), only
// denials fail: what a part of the suite did not use says nothing. With
// judge false (the suite failed) the report is written and nothing fails.
func auditCheck(repoRoot, logPath, reportPath string, judge bool) error {
	if logPath == "" {
		return errors.New("audit check: the API server kept no audit log")
	}
	rbac, err := auditcheck.LoadManifests(filepath.Join(repoRoot, "package", "manifests"))
	if err != nil {
		return fmt.Errorf("audit check: %w", err)
	}
	log, err := auditcheck.ReadLogFile(logPath)
	if err != nil {
		return fmt.Errorf("audit check: %w", err)
	}
	cfg := auditConfig
	cfg.PartialRun = !wholeSuite()
	rep, err := auditcheck.Check(rbac, log, cfg)
	if err != nil {
		return fmt.Errorf("audit check: %w", err)
	}
	details := rep.Details()
	if err := os.WriteFile(reportPath, []byte(details), 0o644); err != nil {
		return err
	}
	if extra := os.Getenv("STRATA_AUDIT_REPORT"); extra != "" {
		if err := os.WriteFile(extra, []byte(details), 0o644); err != nil {
			return err
		}
	}
	fmt.Print(rep.Summary())
	switch {
	case !judge:
		fmt.Printf("audit check: not judged, the suite failed; report: %s\n", reportPath)
		return nil
	case cfg.PartialRun:
		fmt.Println("audit check: part of the suite ran (-run or -skip): only denials and wildcards are checked")
	}
	if rep.Failed() {
		return fmt.Errorf("audit check failed (report: %s):\n%s", reportPath, details)
	}
	return nil
}

// wholeSuite is true when no test was filtered out but the long ones and
// the proofs (make test's -skip '^Test(Long|Proof)').
func wholeSuite() bool {
	value := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	skip := value("test.skip")
	return value("test.run") == "" && (skip == "" || skip == "^Test(Long|Proof)")
}
