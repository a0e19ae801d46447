package conformance

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A ginkgo report as the suite writes it: setup nodes and specs outside
// External Storage left out; each spec's suite and pattern read from its
// text; a failure's first lines kept; a filtered spec told from one the
// suite skipped itself.
func TestReadJUnit(t *testing.T) {
	results, err := ReadJUnit("testdata/junit_01.xml")
	require.NoError(t, err)
	require.Len(t, results, 5)
	want := []struct {
		suite, pattern string
		state          State
		message        string
	}{
		{"provisioning", "Dynamic PV (default fs)", Passed, ""},
		{"volumeMode", "Dynamic PV (block volmode)", Failed,
			"failed: [FAILED] error checking directory /var/lib/kubelet/pods/x/volumes on node 127.0.0.1: command terminated with exit code 1\nIn [It] at: volumemode.go:399 @ 12/08/26 01:00:00.000"},
		{"volumeMode", "Dynamic PV (block volmode)", Skipped, ""},
		{"provisioning", "Dynamic PV (ntfs)", Skipped, "Driver driver.strata.io doesn't support ntfs -- skipping"},
		{"provisioning", "Dynamic PV (default fs)", Failed,
			"timedout: [TIMEDOUT] A suite timeout occurred\nIn [It] at: provisioning.go:1 @ 12/08/26 01:10:00.000"},
	}
	for i, w := range want {
		assert.Equal(t, w.suite, results[i].Suite, "spec %d", i)
		assert.Equal(t, w.pattern, results[i].Pattern, "spec %d", i)
		assert.Equal(t, w.state, results[i].State, "spec %d", i)
		assert.Equal(t, w.message, results[i].Message, "spec %d", i)
	}

	rows, total, filtered := Tally(results)
	assert.Equal(t, 1, filtered, "the [Slow] spec the filter left out")
	assert.Equal(t, Count{Passed: 1, Failed: 2, Skipped: 1}, total)
	assert.Equal(t, []Row{
		{"provisioning", "Dynamic PV (default fs)", Count{Passed: 1, Failed: 1}},
		{"provisioning", "Dynamic PV (ntfs)", Count{Skipped: 1}},
		{"volumeMode", "Dynamic PV (block volmode)", Count{Failed: 1}},
	}, rows)
	assert.Contains(t, Table(rows, total), "| volumeMode | Dynamic PV (block volmode) | 0 | 1 | 0 |\n| **all** | | **1** | **2** | **1** |\n")

	assert.Equal(t, []Reason{{Message: "Driver driver.strata.io doesn't support ntfs -- skipping",
		Specs: []string{"provisioning / Dynamic PV (ntfs)"}}}, SkipReasons(results))
}
