package e2e

import "testing"

// TestDefaultBackupTargetUsers runs, one after another, the tests that point
// the one default backup target at an S3 server of their own. As a group
// they run beside the other parallel tests at the end, when no test kills a
// manager any more; none of them injects a fault. (The fault tests that
// need the default target, a throttled one, run before, alone.)
func TestDefaultBackupTargetUsers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"BackupIncrementalToS3AndDelete", testBackupIncrementalToS3AndDelete},
		{"BackupGCAfterDeleteAndVerify", testBackupGCAfterDeleteAndVerify},
		{"RestoreBackupsIntoNewVolumes", testRestoreBackupsIntoNewVolumes},
		{"RestoreOntoBackingImage", testRestoreOntoBackingImage},
		{"RecurringJobRetainAndRename", testRecurringJobRetainAndRename},
	} {
		t.Run(tc.name, tc.run)
	}
}
