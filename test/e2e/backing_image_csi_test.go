package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/ulikunitz/xz"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Byte equality for every accepted format: a .gz and an .xz of a raw image,
// and an .xz of a qcow2, each read back through the volume's NBD endpoint,
// equal the raw image (for the qcow2, qemu-img convert -O raw of it). The
// .xz arrives as an upload to a manager's HTTP API instead of a download.
func TestBackingImageFormats(t *testing.T) {
	t.Parallel() // objects of its own, no fault
	srv := startImageServer(t)
	rawPath, sum := rawTestImage(t, srv.dir, "fmt.raw", 12<<20)
	raw, err := os.ReadFile(rawPath)
	require.NoError(t, err)
	qcow := filepath.Join(srv.dir, "fmt.qcow2")
	runCmd(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", rawPath, qcow)
	expectFromQcow := filepath.Join(t.TempDir(), "q.raw")
	runCmd(t, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", qcow, expectFromQcow)
	fromQcow, err := os.ReadFile(expectFromQcow)
	require.NoError(t, err)
	qcowBytes, err := os.ReadFile(qcow)
	require.NoError(t, err)

	tests := []struct {
		name   string
		file   []byte
		upload bool
		expect []byte
	}{
		{name: "gz", file: gzipBytes(t, raw), expect: raw},
		{name: "xz", file: xzBytes(t, raw), expect: raw, upload: true},
		{name: "qcow2-xz", file: xzBytes(t, qcowBytes), expect: fromQcow},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := "e2e-bi-fmt-" + tc.name
			spec := downloadSpec(srv.url+"/fmt."+tc.name, sha512Hex(tc.expect))
			if tc.upload {
				spec = v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeUpload, Checksum: sha512Hex(tc.expect)}
			} else {
				require.NoError(t, os.WriteFile(filepath.Join(srv.dir, "fmt."+tc.name), tc.file, 0o644))
			}
			createBackingImage(t, name, spec)
			if tc.upload {
				waitBackingImage(t, name, time.Minute, "a UUID", func(bi *v1beta1.BackingImage) bool { return bi.Status.UUID != "" })
				code, body := upload(t, env.managers["node-2"].APIAddr, name, tc.file)
				require.Equal(t, http.StatusOK, code, body)
				assert.Contains(t, body, sha512Hex(tc.expect))
				code, body = upload(t, env.managers["node-1"].APIAddr, name, tc.file)
				assert.Equal(t, http.StatusConflict, code, "a second upload: %s", body)
			}
			bi := waitBackingImage(t, name, time.Minute, "first copy ready", allCopiesReady(1))
			assert.Equal(t, sha512Hex(tc.expect), bi.Status.Checksum)
			vol := fmt.Sprintf("e2e-bi-fmt-v%d", i)
			createVolume(t, vol, "16Mi", 1, func(v *v1beta1.Volume) { v.Spec.BackingImage = name })
			updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-3"))
			v := waitVolume(t, vol, 2*time.Minute, "attached to node-3", attachedTo("node-3"))
			assertVolumeHoldsImage(t, v.Status.FrontendEndpoint, tc.expect)
			updateTickets(t, vol, removeTicket("admin"))
		})
	}
	_ = sum
}

// upload PUTs an image to a manager's API, with the token of a
// ServiceAccount that may upload (upload_auth_test.go), and returns the
// status and body.
func upload(t *testing.T, apiAddr, image string, data []byte) (int, string) {
	t.Helper()
	r := uploadWith(t, apiAddr, image, uploaderToken(t), bytes.NewReader(data), int64(len(data)))
	return r.code, r.body
}

func gzipBytes(t *testing.T, data []byte) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, err := w.Write(data)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return b.Bytes()
}

func xzBytes(t *testing.T, data []byte) []byte {
	var b bytes.Buffer
	w, err := xz.NewWriter(&b)
	require.NoError(t, err)
	_, err = w.Write(data)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return b.Bytes()
}
