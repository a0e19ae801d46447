package e2e

import (
	"bytes"
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

// tryKubectl runs kubectl and returns its standard output, and its error
// (with both outputs) instead of failing the test, for commands that may
// need a retry. Standard error stays out of the result: kubectl logs its
// own hiccups there (a websocket's "Unknown stream id" during exec), which
// are not the command's output.
func tryKubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath("kubectl")
	require.NoError(t, err, "kubectl must be installed (.ci/run installs it)")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(path, append([]string{"--kubeconfig", env.cluster.AdminKubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), fmt.Errorf("kubectl %s: %w: %s%s", strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.String(), nil
}

func TestKubectl(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
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
