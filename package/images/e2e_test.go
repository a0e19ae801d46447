package images

import (
	"context"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The e2e test images under their upstream names: busybox's applets in
// each, the agnhost stand-in as agnhost's entrypoint with pause as its
// default, httpd serving a page in nginx's; a second build finds them all
// in the cache.
func TestBuildE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images")
	}
	opts := Options{CacheDir: t.TempDir(), Log: logrus.New()}
	imgs, err := BuildE2E(context.Background(), opts)
	require.NoError(t, err)
	refs := []string{E2EBusyBoxRef, E2EAgnhostRef, E2ENginxRef, E2EGlibcDNSTestingRef}
	require.Len(t, imgs, len(refs))
	byRef := map[string]*image{}
	for i, ref := range refs {
		assert.Equal(t, ref, imgs[i].Ref)
		byRef[ref] = readImage(t, imgs[i].Tar)
		assert.Equal(t, []string{ref}, byRef[ref].repoTags)
		assert.Equal(t, "busybox", byRef[ref].entries["bin/sh"].Linkname, "%s has a shell", ref)
	}
	busybox := byRef[E2EBusyBoxRef]
	assert.Equal(t, []string{"sh"}, busybox.config.Config.Cmd, "as upstream's")
	assert.Equal(t, int64(0o1777), busybox.entries["tmp/"].Mode)
	assert.Contains(t, busybox.contents["etc/passwd"], "root:x:0:0:")

	agnhost := byRef[E2EAgnhostRef]
	assert.Equal(t, []string{"/agnhost"}, agnhost.config.Config.Entrypoint)
	assert.Equal(t, []string{"pause"}, agnhost.config.Config.Cmd)
	assert.Equal(t, int64(0o755), agnhost.entries["agnhost"].Mode)
	assert.Equal(t, "busybox", agnhost.entries["bin/nsenter"].Linkname)
	assert.Equal(t, "/agnhost", agnhost.entries["usr/local/bin/nsenter"].Linkname, "hostexec Pods exec nsenter: the stand-in's first")

	nginx := byRef[E2ENginxRef]
	assert.Equal(t, []string{"httpd", "-f", "-p", "80", "-h", "/usr/share/nginx/html"}, nginx.config.Config.Cmd)
	assert.Contains(t, nginx.contents["usr/share/nginx/html/index.html"], "nginx")

	again, err := BuildE2E(context.Background(), opts)
	require.NoError(t, err)
	assert.Equal(t, imgs, again)
}
