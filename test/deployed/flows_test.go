package deployed

import "testing"

// deployedParallel is how many of the user flows run at once: they mostly
// wait (for Pods, attachments, snapshots), so more than one per core.
const deployedParallel = 8

// TestUserFlows runs the user's flows side by side, each with claims,
// Pods, classes and namespaces of its own. The tests that replace
// Strata's Pods, kill a process, upgrade, rotate the CA or uninstall change
// what every flow stands on, so they are top-level tests of their own, run
// alone before (consistency, deployed) and after (leftovers, rolling
// upgrade, rotation, uninstall) this one: go test runs top-level tests in
// file order.
//
//	go test ./test/deployed -run 'TestUserFlows/RESTAPI$'
func TestUserFlows(t *testing.T) {
	for _, flow := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"GroupSnapshotHoldsWhatThePodJustWrote", testGroupSnapshotHoldsWhatThePodJustWrote}, // the longest first
		{"TrimFreesADeletedSnapshotsSpace", testTrimFreesADeletedSnapshotsSpace},
		{"PVCResizeWhilePodRuns", testPVCResizeWhilePodRuns},
		{"SnapshotHoldsWhatThePodJustWrote", testSnapshotHoldsWhatThePodJustWrote},
		{"NonRootPodWritesItsClaim", testNonRootPodWritesItsClaim},
		{"BackingImageClaimAndItsClone", testBackingImageClaimAndItsClone},
		{"BackupRestoredIntoANewClaim", testBackupRestoredIntoANewClaim},
		{"BlockSnapshotHoldsWhatThePodJustWrote", testBlockSnapshotHoldsWhatThePodJustWrote},
		{"SnapshotRestoredOnAnotherNode", testSnapshotRestoredOnAnotherNode},
		{"PVCUsedByPodsOnTwoNodes", testPVCUsedByPodsOnTwoNodes},
		{"PVCBlockModeOnTwoNodes", testPVCBlockModeOnTwoNodes},
		{"VolumeSnapshotRetainPolicy", testVolumeSnapshotRetainPolicy},
		{"QuotaRefusesAVolumeSnapshotOverTheNamespaceQuota", testQuotaRefusesAVolumeSnapshotOverTheNamespaceQuota},
		{"RESTSnapshotBlocks", testRESTSnapshotBlocks},
		{"RESTAPI", testRESTAPI},
		{"RESTRevert", testRESTRevert},
		{"SnapshotMetadataThroughTheSidecar", testSnapshotMetadataThroughTheSidecar},
		{"SnapshotMetadataDeltaOfOnePercentThroughTheSidecar", testSnapshotMetadataDeltaOfOnePercentThroughTheSidecar},
		{"KubectlStrataPlugin", testKubectlStrataPlugin},
		{"KubectlStrataWithAClientCertificate", testKubectlStrataWithAClientCertificate},
		{"ManagerTokenOpensNoOtherDoor", testManagerTokenOpensNoOtherDoor},
		{"ComponentsRunConfined", testComponentsRunConfined},
		{"AnotherNodesCertificateIsRefused", testAnotherNodesCertificateIsRefused},
		{"SignerBindsRequestsToTheTokensNode", testSignerBindsRequestsToTheTokensNode},
	} {
		t.Run(flow.name, func(t *testing.T) {
			t.Parallel()
			flow.run(t)
		})
	}
}
