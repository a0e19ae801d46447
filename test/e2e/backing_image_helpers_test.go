package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// imageServer serves a directory over HTTP on loopback, as an image host
// would (Range requests included), and remembers what it was asked.
type imageServer struct {
	dir, url string
	// bytesPerSecond throttles every response when set (0: full speed).
	bytesPerSecond atomic.Int64
	mu             sync.Mutex
	ranges         []string // Range headers seen, by path
	gets           map[string]int
}

func startImageServer(t *testing.T) *imageServer {
	t.Helper()
	s := &imageServer{dir: t.TempDir(), gets: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	files := http.FileServer(http.Dir(s.dir))
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.gets[r.URL.Path]++
		if rg := r.Header.Get("Range"); rg != "" {
			s.ranges = append(s.ranges, r.URL.Path+" "+rg)
		}
		s.mu.Unlock()
		if bps := s.bytesPerSecond.Load(); bps > 0 {
			w = &slowWriter{ResponseWriter: w, bps: bps}
		}
		files.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.url = "http://" + ln.Addr().String()
	return s
}

// slowWriter paces a response to about bps bytes per second.
type slowWriter struct {
	http.ResponseWriter
	bps int64
}

func (w *slowWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), 64<<10)]
		m, err := w.ResponseWriter.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		time.Sleep(time.Duration(int64(m) * int64(time.Second) / w.bps))
		b = b[m:]
	}
	return n, nil
}

// getsOf is how many requests asked for path.
func (s *imageServer) getsOf(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[path]
}

func (s *imageServer) rangesFor(path string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.ranges {
		if strings.HasPrefix(r, path+" ") {
			out = append(out, r)
		}
	}
	return out
}

// rawTestImage writes a raw disk image of size bytes: random data in a few
// places, holes between, and returns its path and SHA-512.
func rawTestImage(t *testing.T, dir, name string, size int64) (string, string) {
	t.Helper()
	img := make([]byte, size)
	for _, off := range []int64{0, size / 3, size - 1<<20} {
		_, err := rand.Read(img[off : off+1<<20])
		require.NoError(t, err)
	}
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, img, 0o644))
	return path, sha512Hex(img)
}

func sha512Hex(b []byte) string {
	s := sha512.Sum512(b)
	return hex.EncodeToString(s[:])
}

func fileSHA512(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return sha512Hex(b)
}

// run runs a command and fails the test with its output.
func runCmd(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %v: %s", name, args, out)
	return string(out)
}

func createBackingImage(t *testing.T, name string, spec v1beta1.BackingImageSpec) {
	t.Helper()
	bi := &v1beta1.BackingImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().BackingImages(ns).Create(context.Background(), bi, metav1.CreateOptions{})
		if err != nil {
			t.Logf("create backing image %s: %v", name, err)
		}
		return err == nil
	}, 30*time.Second, 500*time.Millisecond)
	t.Cleanup(func() { deleteBackingImage(t, name) })
}

func downloadSpec(url, checksum string) v1beta1.BackingImageSpec {
	return v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeDownload,
		SourceParameters: map[string]string{v1beta1.BackingImageParameterURL: url}, Checksum: checksum}
}

// deleteBackingImage deletes the image and waits until it is gone.
func deleteBackingImage(t *testing.T, name string) {
	t.Helper()
	err := env.adminStrata.StrataV1beta1().BackingImages(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().BackingImages(ns).Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, 250*time.Millisecond, "backing image %s is not gone", name)
}

func getBackingImage(t *testing.T, name string) *v1beta1.BackingImage {
	t.Helper()
	bi, err := env.adminStrata.StrataV1beta1().BackingImages(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return bi
}

func waitBackingImage(t *testing.T, name string, timeout time.Duration, what string, cond func(*v1beta1.BackingImage) bool) *v1beta1.BackingImage {
	t.Helper()
	var last *v1beta1.BackingImage
	ok := false
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		bi, err := env.adminStrata.StrataV1beta1().BackingImages(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		last = bi
		if cond(bi) {
			ok = true
			break
		}
	}
	require.True(t, ok, "backing image %s: %s within %s; last status: %+v", name, what, timeout, describeImage(last))
	return last
}

func describeImage(bi *v1beta1.BackingImage) string {
	if bi == nil {
		return "<none>"
	}
	var b strings.Builder
	b.WriteString("copies " + bi.Status.Copies + " spec [")
	for d := range bi.Spec.DiskFileSpecMap {
		b.WriteString(d + " ")
	}
	b.WriteString("] status [")
	for d, st := range bi.Status.DiskFileStatusMap {
		b.WriteString(d + "=" + string(st.State) + ":" + st.Message + " ")
	}
	b.WriteString("]")
	return b.String()
}

// allCopiesReady: every wanted disk holds a ready copy (at least n of them).
func allCopiesReady(n int) func(*v1beta1.BackingImage) bool {
	return func(bi *v1beta1.BackingImage) bool {
		if len(bi.Spec.DiskFileSpecMap) < n {
			return false
		}
		for d := range bi.Spec.DiskFileSpecMap {
			if st := bi.Status.DiskFileStatusMap[d]; st == nil || st.State != v1beta1.BackingImageStateReady {
				return false
			}
		}
		return true
	}
}

// secondAttempt: some copy failed and was tried again.
func secondAttempt(bi *v1beta1.BackingImage) bool {
	for _, st := range bi.Status.DiskFileStatusMap {
		if st.Attempts >= 2 {
			return true
		}
	}
	return false
}

// diskOf is the UUID of a node's only disk, and its path.
func diskOf(t *testing.T, node string) (string, string) {
	t.Helper()
	n := getNode(t, node)
	for name, st := range n.Status.DiskStatus {
		return st.DiskUUID, n.Spec.Disks[name].Path
	}
	t.Fatalf("node %s has no disk", node)
	return "", ""
}

// copyPath is the image's file on a node's disk.
func copyPath(t *testing.T, bi *v1beta1.BackingImage, node string) string {
	_, path := diskOf(t, node)
	return filepath.Join(path, "backing-images", bi.Name+"-"+bi.Status.UUID, "backing")
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Sys().(*syscall.Stat_t).Ino
}

// readVolume reads size bytes of a volume's NBD export with nbdcopy.
func readVolume(t *testing.T, endpoint string, size int64) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "volume.raw")
	runCmd(t, "nbdcopy", endpoint, out)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.GreaterOrEqual(t, int64(len(b)), size)
	return b
}

// assertVolumeHoldsImage: the volume reads as the raw image, zeros after.
func assertVolumeHoldsImage(t *testing.T, endpoint string, raw []byte) {
	t.Helper()
	got := readVolume(t, endpoint, int64(len(raw)))
	require.Equal(t, sha512Hex(raw), sha512Hex(got[:len(raw)]), "the volume's first %d bytes are the image", len(raw))
	require.True(t, bytes.Count(got[len(raw):], []byte{0}) == len(got)-len(raw), "the volume reads zeros past the image")
}

// setNodeScheduling turns a node's scheduling on or off.
func setNodeScheduling(t *testing.T, node string, on bool) {
	t.Helper()
	require.NoError(t, retryOnConflict(func() error {
		n, err := env.adminStrata.StrataV1beta1().Nodes(ns).Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.AllowScheduling = on
		_, err = env.adminStrata.StrataV1beta1().Nodes(ns).Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	}))
}

func setReplicaCount(t *testing.T, volume string, n int32) {
	t.Helper()
	require.NoError(t, retryOnConflict(func() error {
		v, err := env.adminStrata.StrataV1beta1().Volumes(ns).Get(context.Background(), volume, metav1.GetOptions{})
		if err != nil {
			return err
		}
		v.Spec.NumberOfReplicas = n
		_, err = env.adminStrata.StrataV1beta1().Volumes(ns).Update(context.Background(), v, metav1.UpdateOptions{})
		return err
	}))
}

func deleteReplica(name string) error {
	err := env.adminStrata.StrataV1beta1().Replicas(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
