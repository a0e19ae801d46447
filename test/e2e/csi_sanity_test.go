package e2e

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	ginkgotypes "github.com/onsi/ginkgo/v2/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// notYetPassing lists, by exact name, the csi-sanity specs the driver does
// not pass yet, each with the reason. It only shrinks: issue 12 is done when
// it is empty.
var notYetPassing = map[string]string{}

// How many of csi-test's specs run against the driver, and how many the
// suite skips itself (those of capabilities the driver does not
// advertise). A change in either means a capability or the suite changed:
// look at which, then update them.
const (
	wantSanityRan     = 84
	wantSanitySkipped = 19
)

// csi-sanity, the CSI project's conformance suite, against the real driver
// (controller and node services on one socket, the node being node-2) on
// the live cluster: real volumes, attachments, filesystems and mounts.
func TestCSISanity(t *testing.T) {
	// Not parallel: its ListVolumes specs count every volume of the
	// cluster, and the parallel tests make and delete theirs meanwhile.
	var skip []string
	for name, reason := range notYetPassing {
		t.Logf("not expected to pass yet: %q: %s", name, reason)
		skip = append(skip, regexp.QuoteMeta(name))
	}
	if len(skip) > 0 {
		require.NoError(t, flag.Set("ginkgo.skip", strings.Join(skip, "|")))
	}
	socket := filepath.Join(env.runDir, "csi-sanity.sock")
	startCSIPlugin(t, "csi-sanity", socket, "--mode", "both", "--node-name", nodeNames[1],
		"--kubelet-root", filepath.Join(env.runDir, "csi-sanity-kubelet"), "--state-dir", filepath.Join(env.runDir, "csi-state", "sanity"))

	cfg := sanity.NewTestConfig()
	cfg.Address = socket
	cfg.TargetPath = filepath.Join(env.runDir, "csi-sanity", "target")
	cfg.StagingPath = filepath.Join(env.runDir, "csi-sanity", "staging")
	require.NoError(t, os.MkdirAll(filepath.Dir(cfg.TargetPath), 0o755)) // csi-sanity makes only the last element
	cfg.TestVolumeSize = 64 << 20
	cfg.TestVolumeParameters = map[string]string{"numberOfReplicas": "2"}
	cfg.IdempotentCount = 2
	report := filepath.Join(t.TempDir(), "ginkgo.json")
	require.NoError(t, flag.Set("ginkgo.json-report", report))
	sanity.Test(t, cfg)

	ran, skipped, failed := sanityCounts(t, report)
	t.Logf("csi-sanity: %d specs ran, %d skipped, %d failed", ran, skipped, failed)
	assert.Zero(t, failed, "specs failed")
	assert.Equal(t, wantSanityRan, ran, "specs that ran")
	assert.Equal(t, wantSanitySkipped, skipped, "specs csi-sanity skipped")
}

// sanityCounts reads Ginkgo's JSON report of the run: how many specs (It
// nodes) ran, were skipped (by the suite or by ginkgo.skip) and failed.
func sanityCounts(t *testing.T, path string) (ran, skipped, failed int) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err, "ginkgo's JSON report")
	var reports []ginkgotypes.Report
	require.NoError(t, json.Unmarshal(raw, &reports))
	require.Len(t, reports, 1)
	for _, s := range reports[0].SpecReports {
		if s.LeafNodeType != ginkgotypes.NodeTypeIt {
			continue
		}
		switch {
		case s.State == ginkgotypes.SpecStateSkipped || s.State == ginkgotypes.SpecStatePending:
			t.Logf("skipped: %s", s.FullText())
			skipped++
		case s.State.Is(ginkgotypes.SpecStateFailureStates):
			ran++
			failed++
		default:
			ran++
		}
	}
	return ran, skipped, failed
}
