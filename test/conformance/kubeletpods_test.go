package conformance

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each node's Pod directories appear under the one directory the suite
// reads, through links that follow the Pods: made for a new Pod, removed
// with its directory, all removed (and the directory it made) on Stop;
// a link it did not make is left alone.
func TestPodDirLinks(t *testing.T) {
	base := t.TempDir()
	node1, node2 := filepath.Join(base, "n1"), filepath.Join(base, "n2")
	mkdir(t, node1, "pods", "uid-a", "volumes", "kubernetes.io~csi", "pvc-1")
	dir := filepath.Join(base, "var", "lib", "kubelet", "pods")

	l, err := StartPodDirLinks(dir, []string{node1, node2}, time.Hour)
	require.NoError(t, err)
	assert.DirExists(t, filepath.Join(dir, "uid-a", "volumes", "kubernetes.io~csi", "pvc-1"), "through the link")

	mkdir(t, node2, "pods", "uid-b", "volumeDevices")
	require.NoError(t, os.Symlink("/elsewhere", filepath.Join(dir, "uid-c")))
	require.NoError(t, l.Sync())
	now, _ := l.Links()
	assert.Equal(t, 2, now)
	target, err := os.Readlink(filepath.Join(dir, "uid-b"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(node2, "pods", "uid-b"), target)

	require.NoError(t, os.RemoveAll(filepath.Join(node1, "pods", "uid-a")))
	require.NoError(t, l.Sync())
	assert.NoFileExists(t, filepath.Join(dir, "uid-a"))
	now, total := l.Links()
	assert.Equal(t, []int{1, 2}, []int{now, total})

	err = l.Stop()
	assert.ErrorContains(t, err, "not empty", "uid-c is someone else's: the directory stays")
	assert.NoFileExists(t, filepath.Join(dir, "uid-b"))
	_, err = os.Lstat(filepath.Join(dir, "uid-c"))
	assert.NoError(t, err)
}

// A directory that was there before is never removed.
func TestPodDirLinksKeepsAnExistingDirectory(t *testing.T) {
	dir := t.TempDir()
	l, err := StartPodDirLinks(dir, nil, time.Hour)
	require.NoError(t, err)
	require.NoError(t, l.Stop())
	assert.DirExists(t, dir)
}

func mkdir(t *testing.T, elem ...string) {
	require.NoError(t, os.MkdirAll(filepath.Join(elem...), 0o755))
}
