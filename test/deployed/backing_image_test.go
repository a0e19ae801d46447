package deployed

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// A backing image and a clone on the install. An ext4 image holding
// guests/ is converted to qcow2 and served over HTTP; a StorageClass names
// it by name, URL and checksum, so the first claim creates the
// BackingImage: a manager's Pod downloads it and converts it with the
// image's own qemu-img. A Pod on one node finds guests/ and writes a file;
// a clone of the claim (dataSource: the claim) read by a Pod on another
// node holds both; the image's copies on the disks are unchanged.
func testBackingImageClaimAndItsClone(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	require.NoError(t, os.MkdirAll(filepath.Join(tree, "guests", "alpine"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tree, "guests", "alpine", "release"), []byte("strata-guest-1\n"), 0o644))
	raw := filepath.Join(dir, "fs.raw")
	runCmd(t, "mkfs.ext4", "-q", "-F", "-L", "guests", "-d", tree, raw, "48M")
	served := filepath.Join(dir, "served")
	require.NoError(t, os.Mkdir(served, 0o755))
	runCmd(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, filepath.Join(served, "fs.qcow2"))
	sum := sha512File(t, raw)
	url := serveDir(t, served)

	const image, class = "d-bi-fs", "strata-d-bi-fs"
	t.Cleanup(func() { // after the claims' cleanups, which run first
		_, _ = kubectlOut(ctx, "-n", ns, "delete", "backingimage", image, "--timeout=2m")
	})
	apply(t, fmt.Sprintf(`apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %s}
provisioner: driver.strata.io
parameters: {numberOfReplicas: "2", backingImage: %s, backingImageURL: "%s/fs.qcow2", backingImageChecksum: "%s"}`,
		class, image, url, sum))
	t.Cleanup(func() { _, _ = kubectlOut(ctx, "delete", "storageclass", class) })

	claimIn(t, podNamespace, "bi-src", "64Mi", "storageClassName: "+class)
	pod(t, "bi-src", "127.0.0.1", "bi-src", "dd if=/dev/urandom of=/data/written bs=1M count=4 2>/dev/null && sync && exec sleep 3600")
	assert.Equal(t, "strata-guest-1", exec1(t, "bi-src", "cat /data/guests/alpine/release"))
	var written string
	require.Eventually(t, func() bool {
		out, err := tryExecIn(podNamespace, "bi-src",
			"test -s /data/written && sync && sha256sum /data/written /data/guests/alpine/release")
		written = out
		return err == nil
	}, time.Minute, 200*time.Millisecond, "the Pod wrote its file")
	bi, err := env.strata.StrataV1beta1().BackingImages(ns).Get(ctx, image, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, v1beta1.BackingImageSourceTypeDownload, bi.Spec.SourceType, "the claim created the image")

	claimIn(t, podNamespace, "bi-clone", "64Mi",
		"storageClassName: "+class+", dataSource: {kind: PersistentVolumeClaim, name: bi-src}")
	pod(t, "bi-clone", "127.0.0.3", "bi-clone", "exec sleep 3600")
	assert.Equal(t, written, exec1(t, "bi-clone", "sha256sum /data/written /data/guests/alpine/release"),
		"the clone holds the image's files and what the Pod wrote")

	bi, err = env.strata.StrataV1beta1().BackingImages(ns).Get(ctx, image, metav1.GetOptions{})
	require.NoError(t, err)
	copies := 0
	for _, node := range env.cluster.Nodes() {
		path := filepath.Join(node.DiskDir(), "backing-images", image+"-"+bi.Status.UUID, "backing")
		if _, err := os.Stat(path); err == nil {
			copies++
			assert.Equal(t, sum, sha512File(t, path), "the copy on %s after the writes", node.Name)
		}
	}
	assert.GreaterOrEqual(t, copies, 2, "a copy on each node holding a replica")
}

func runCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s: %s", name, out)
}

func sha512File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha512.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// serveDir serves dir over HTTP on loopback until the test ends; the
// managers' Pods share the host's network here.
func serveDir(t *testing.T, dir string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.FileServer(http.Dir(dir))}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
