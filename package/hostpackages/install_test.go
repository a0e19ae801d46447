package hostpackages

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/test/need"
)

// installPackage is what the install test takes away and has the script
// put back: a real Debian package nothing else here runs (the benchmarks
// of a later issue will), so removing it for a moment disturbs no test.
const installPackage = "fio"

// runScript runs scripts/host-packages.sh for the node role of list, as
// the given user ("" for this process's).
func runScript(t *testing.T, list, user string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "packages.txt")
	require.NoError(t, os.WriteFile(path, []byte(list), 0o644))
	// Readable by the other user too (t.TempDir's directories are private).
	for _, d := range []string{dir, filepath.Dir(dir)} {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	args := []string{"../../scripts/host-packages.sh", "node"}
	if user != "" {
		args = append([]string{"setpriv", "--reuid=" + user, "--regid=" + user, "--clear-groups"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "STRATA_HOST_PACKAGES="+path)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// requireAptRoot skips a test that needs root and apt-get; under CI=true
// (set by .ci/run) it fails instead: CI never passes by skipping.
func requireAptRoot(t *testing.T) {
	t.Helper()
	need.Root(t, "to install packages")
	need.Tool(t, "apt-get", "apt")
}

// Without root the script changes nothing and names the exact command,
// with each missing package once; with nothing missing it says nothing.
func TestHostPackagesWithoutRoot(t *testing.T) {
	requireAptRoot(t) // root, to become another user
	list := "node qemu-utils qemu-img\n" +
		"node no-such-package-a /no/such/file-a\n" +
		"node no-such-package-a /no/such/file-b\n" +
		"image no-such-package-c /no/such/file-c\n"
	out, err := runScript(t, list, "65534")
	require.Error(t, err, out)
	assert.Contains(t, out, "missing /no/such/file-a /no/such/file-b (roles: node)")
	assert.Contains(t, out, "  apt-get update && apt-get install -y no-such-package-a\n",
		"only the node role's missing package, once")

	out, err = runScript(t, "node qemu-utils qemu-img\n", "65534")
	require.NoError(t, err, out)
	assert.Empty(t, out)
}

// As root on Debian the script installs what is missing, for real, and
// says what it installed.
func TestHostPackagesInstallsAsRoot(t *testing.T) {
	requireAptRoot(t)
	remove := exec.Command("apt-get", "remove", "-y", "-qq", installPackage)
	remove.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	out, err := remove.CombinedOutput()
	require.NoError(t, err, string(out))
	_, err = exec.LookPath(installPackage)
	require.Error(t, err, "%s is still there after its removal", installPackage)

	got, err := runScript(t, "node "+installPackage+" "+installPackage+"\n", "")
	require.NoError(t, err, got)
	assert.Contains(t, got, "installing Debian packages "+installPackage+" (missing: "+installPackage+")")
	assert.True(t, strings.HasSuffix(got, "installed "+installPackage+"\n"), got)
	_, err = exec.LookPath(installPackage)
	assert.NoError(t, err, "installed, so found")

	// Run again: nothing to do, nothing said.
	got, err = runScript(t, "node "+installPackage+" "+installPackage+"\n", "")
	require.NoError(t, err, got)
	assert.Empty(t, got)
}

// A package that installs but does not bring the file the list names is
// an error in the list, said as such.
func TestHostPackagesWrongFileInList(t *testing.T) {
	requireAptRoot(t)
	got, err := runScript(t, "node "+installPackage+" /no/such/fio-file\n", "")
	require.Error(t, err, got)
	assert.Contains(t, got, "but /no/such/fio-file still missing")
}

// A package apt cannot install stops the script with apt's own words.
func TestHostPackagesAptFailure(t *testing.T) {
	requireAptRoot(t)
	got, err := runScript(t, "node no-such-package-strata /no/such/file\n", "")
	require.Error(t, err, got)
	assert.Contains(t, got, "no-such-package-strata", "apt's output is shown")
	assert.Contains(t, got, "strata: apt-get install no-such-package-strata failed")
}
