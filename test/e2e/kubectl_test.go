package e2e

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kubectl is how admins use Strata; these are the commands the README shows.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := tryKubectl(t, args...)
	require.NoError(t, err)
	return out
}

// tryKubectl runs kubectl and returns its error (with its output) instead
// of failing the test, for commands that may need a retry.
func tryKubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath("kubectl")
	require.NoError(t, err, "kubectl must be installed (.ci/run installs it)")
	out, err := exec.Command(path, append([]string{"--kubeconfig", env.cluster.AdminKubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func TestKubectl(t *testing.T) {
	require.Eventually(t, func() bool {
		for _, n := range nodeNames {
			if nodeReady(t, n) != "True" {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond)

	t.Run("get nodes.strata.io lists every node Ready with its disk", func(t *testing.T) {
		out := kubectl(t, "get", "nodes.strata.io")
		for _, n := range nodeNames {
			assert.Regexp(t, regexp.MustCompile(`(?m)^`+n+`\s+True\s+true\s+\S+\s+\S*/nodes/`+n+`/disk-1\s`), out)
		}
	})
	t.Run("get strata lists Strata's objects", func(t *testing.T) {
		out := kubectl(t, "get", "strata")
		assert.Contains(t, out, "node.strata.io/node-1")
		assert.Contains(t, out, "setting.strata.io/default-replica-count")
	})
	t.Run("short names", func(t *testing.T) {
		for _, short := range []string{"vol", "eng", "rep", "snap", "va", "bi", "snode", "sset", "srq", "bt", "bv", "bk", "rj", "im"} {
			kubectl(t, "get", short, "-A")
		}
	})
	t.Run("explain shows the field docs", func(t *testing.T) {
		out := kubectl(t, "explain", "volume.spec.numberOfReplicas")
		assert.Contains(t, out, "how many copies of the data are kept")
	})
}
