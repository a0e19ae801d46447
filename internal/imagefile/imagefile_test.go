package imagefile

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/ulikunitz/xz"

	"github.com/strata-storage/strata/test/need"
)

const imageSize = 8 << 20

// rawImage is an 8 MiB disk with data in three places and holes between.
func rawImage(t *testing.T) []byte {
	t.Helper()
	img := make([]byte, imageSize)
	for _, off := range []int{0, 3 << 20, imageSize - 64<<10} {
		_, err := rand.Read(img[off : off+64<<10])
		require.NoError(t, err)
	}
	return img
}

func sha(b []byte) string {
	s := sha512.Sum512(b)
	return hex.EncodeToString(s[:])
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, data, 0o600))
	return p
}

func gzipped(t *testing.T, data []byte) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, err := w.Write(data)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return b.Bytes()
}

func xzed(t *testing.T, data []byte) []byte {
	var b bytes.Buffer
	w, err := xz.NewWriter(&b)
	require.NoError(t, err)
	_, err = w.Write(data)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return b.Bytes()
}

func qcow2Of(t *testing.T, raw string, extra ...string) []byte {
	t.Helper()
	out := raw + ".qcow2"
	args := append([]string{"convert", "-f", "raw", "-O", "qcow2"}, extra...)
	b, err := exec.Command("qemu-img", append(args, raw, out)...).CombinedOutput()
	require.NoError(t, err, "qemu-img: %s", b)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	return data
}

func allocated(t *testing.T, path string) int64 {
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

func TestDetectFormat(t *testing.T) {
	tests := []struct {
		header  []byte
		want    Format
		wantErr string
	}{
		{[]byte("QFI\xfb\x00\x00\x00\x03"), FormatQCOW2, ""},
		{[]byte{0x1f, 0x8b, 0x08}, FormatGzip, ""},
		{[]byte{0xfd, '7', 'z', 'X', 'Z', 0x00, 0x00}, FormatXZ, ""},
		{make([]byte, 512), FormatRaw, ""},
		{[]byte("hello"), FormatRaw, ""},
		{nil, FormatRaw, ""},
		{[]byte("KDMV\x01"), "vmdk", "the image is vmdk"},
		{[]byte("vhdxfile...."), "vhdx", "the image is vhdx"},
		{[]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00}, "zstd", "the image is zstd"},
		{[]byte("\n  <!DOCTYPE HTML><html><body>Sign in"), "html", "HTML page, not an image"},
		{[]byte("<html><head>"), "html", "HTML page, not an image"},
	}
	for _, tc := range tests {
		t.Run(string(tc.want), func(t *testing.T) {
			got, err := DetectFormat(tc.header)
			assert.Equal(t, tc.want, got)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
			// A refused format is for good; an HTML page may be a passing error page.
			assert.Equal(t, tc.want != "html", errors.Is(err, ErrNotAnImage), "errors.Is ErrNotAnImage")
		})
	}
}

// Every source format ends as the same sparse raw file with the raw data's
// checksum; a wrong checksum or a refused format leaves nothing behind.
func TestPrepare(t *testing.T) {
	need.Tool(t, "qemu-img", "qemu-utils")
	dir := t.TempDir()
	img := rawImage(t)
	raw := writeFile(t, dir, "disk.raw", img)
	qcow := qcow2Of(t, raw)
	tests := []struct {
		name        string
		source      []byte
		want        string // spec.checksum
		wantFormats []Format
		wantErr     string
		wantIs      error // the sentinel a failure wraps, if any
	}{
		{name: "raw", source: img, wantFormats: []Format{FormatRaw}},
		{name: "raw, checksum given", source: img, want: sha(img), wantFormats: []Format{FormatRaw}},
		{name: "gzip of raw", source: gzipped(t, img), wantFormats: []Format{FormatGzip, FormatRaw}},
		{name: "xz of raw", source: xzed(t, img), wantFormats: []Format{FormatXZ, FormatRaw}},
		{name: "qcow2", source: qcow, want: sha(img), wantFormats: []Format{FormatQCOW2, FormatRaw}},
		{name: "compressed qcow2", source: qcow2Of(t, raw, "-c"), wantFormats: []Format{FormatQCOW2, FormatRaw}},
		{name: "xz of qcow2", source: xzed(t, qcow), wantFormats: []Format{FormatXZ, FormatQCOW2, FormatRaw}},
		{name: "wrong checksum", source: gzipped(t, img), want: strings.Repeat("ab", 64),
			wantErr: "checksum mismatch: spec.checksum is " + strings.Repeat("ab", 64) + ", the image's raw data has SHA-512 " + sha(img),
			wantIs:  ErrChecksumMismatch},
		{name: "vmdk", source: append([]byte("KDMV"), make([]byte, 1020)...), wantErr: "the image is vmdk", wantIs: ErrNotAnImage},
		{name: "xz of vmdk", source: xzed(t, append([]byte("KDMV"), make([]byte, 1020)...)), wantErr: "the image is vmdk",
			wantIs: ErrNotAnImage},
		{name: "raw of a partial sector", source: make([]byte, 1000), wantErr: "not a whole number of 512-byte sectors",
			wantIs: ErrNotAnImage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			work := t.TempDir()
			src := writeFile(t, work, "download.part", tc.source)
			final := filepath.Join(work, "image.raw")
			res, err := Prepare(context.Background(), src, final, tc.want, Limits{})
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.ErrorIs(t, err, tc.wantIs)
				assert.NoFileExists(t, final)
			} else {
				require.NoError(t, err)
				got, err := os.ReadFile(final)
				require.NoError(t, err)
				assert.True(t, bytes.Equal(img, got), "the raw data")
				assert.Equal(t, sha(img), res.Checksum)
				assert.Equal(t, int64(imageSize), res.VirtualSize)
				assert.Equal(t, tc.wantFormats, res.Formats)
				assert.Less(t, allocated(t, final), int64(imageSize/2), "the raw file is sparse")
			}
			entries, err := os.ReadDir(work)
			require.NoError(t, err)
			for _, e := range entries {
				assert.False(t, strings.Contains(e.Name(), ".tmp"), "work file %s left", e.Name())
			}
			assert.FileExists(t, src, "the source stays for a resumed download")
		})
	}
}

// A qcow2 naming a backing file would make qemu-img read that path: refused.
func TestPrepareRefusesBackingFile(t *testing.T) {
	need.Tool(t, "qemu-img", "qemu-utils")
	dir := t.TempDir()
	base := writeFile(t, dir, "base.raw", rawImage(t))
	overlay := filepath.Join(dir, "overlay.qcow2")
	out, err := exec.Command("qemu-img", "create", "-f", "qcow2", "-F", "raw", "-b", base, overlay).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = Prepare(context.Background(), overlay, filepath.Join(dir, "image.raw"), "", Limits{})
	assert.ErrorContains(t, err, `has a backing file ("`+base+`")`)
	assert.ErrorIs(t, err, ErrNotAnImage)
}

// rangeServer serves data, honouring Range unless noRanges; it counts the
// requests that asked for a range.
func rangeServer(t *testing.T, data []byte, noRanges bool, ranged *atomic.Int32) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/image" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Range") != "" {
			ranged.Add(1)
		}
		if noRanges {
			_, _ = w.Write(data)
			return
		}
		http.ServeContent(w, r, "image", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestDownload(t *testing.T) {
	data := rawImage(t)
	tests := []struct {
		name       string
		partial    int // bytes already in the part file
		noRanges   bool
		path       string
		wantRanged int32
		wantErr    string
	}{
		{name: "fresh", path: "/image"},
		{name: "resumed with a range", partial: 3 << 20, path: "/image", wantRanged: 1},
		{name: "server without ranges: started over", partial: 3 << 20, noRanges: true, path: "/image", wantRanged: 1},
		{name: "already complete", partial: imageSize, path: "/image", wantRanged: 1},
		{name: "not found", path: "/nope", wantErr: "404 Not Found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ranged atomic.Int32
			srv := rangeServer(t, data, tc.noRanges, &ranged)
			part := filepath.Join(t.TempDir(), "download.part")
			if tc.partial > 0 {
				require.NoError(t, os.WriteFile(part, data[:tc.partial], 0o600))
			}
			var lastDone, lastTotal int64
			n, err := Download(context.Background(), testPolicy, srv.URL+tc.path, part, func(done, total int64) { lastDone, lastTotal = done, total })
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, int64(imageSize), n)
			got, err := os.ReadFile(part)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, got), "the downloaded bytes")
			assert.Equal(t, tc.wantRanged, ranged.Load(), "range requests")
			if tc.partial < imageSize {
				assert.Equal(t, int64(imageSize), lastDone)
				wantTotal := int64(imageSize)
				if tc.noRanges {
					wantTotal = 0 // sent chunked, with no length: unknown
				}
				assert.Equal(t, wantTotal, lastTotal)
			}
		})
	}
}

// A download cut off mid-transfer leaves a prefix that the next call resumes.
// The first response stops after 2 MiB and holds the connection open, so
// the cancel lands mid-transfer whatever the socket buffers hold.
func TestDownloadInterruptedThenResumed(t *testing.T) {
	data := rawImage(t)
	var ranged atomic.Int32
	resume := rangeServer(t, data, false, &ranged)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) > 1 {
			resume.Config.Handler.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		_, _ = w.Write(data[:2<<20])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	part := filepath.Join(t.TempDir(), "download.part")
	ctx, cancel := context.WithCancel(context.Background())
	_, err := Download(ctx, testPolicy, srv.URL+"/image", part, func(done, _ int64) {
		if done >= 2<<20 {
			cancel()
		}
	})
	require.Error(t, err, "cancelled mid-transfer")
	got, err := os.ReadFile(part)
	require.NoError(t, err)
	require.Less(t, len(got), imageSize)
	assert.True(t, bytes.Equal(data[:len(got)], got), "what was written is a prefix")

	_, err = Download(context.Background(), testPolicy, srv.URL+"/image", part, nil)
	require.NoError(t, err)
	got, err = os.ReadFile(part)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, int32(1), ranged.Load(), "the second call asked for the rest only")
}

func TestCopyFile(t *testing.T) {
	dir := t.TempDir()
	img := rawImage(t)
	src := filepath.Join(dir, "src.raw")
	require.NoError(t, writeSparseFile(src, bytes.NewReader(img)))
	dst := filepath.Join(t.TempDir(), "dst.raw")
	var copied int64
	require.NoError(t, CopyFile(context.Background(), src, dst, func(done, _ int64) { copied = done }))
	got, err := os.ReadFile(dst)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(img, got))
	assert.LessOrEqual(t, copied, int64(imageSize/2), "only data extents were copied")
	assert.Less(t, allocated(t, dst), int64(imageSize/2), "holes stay holes")
	assert.NoFileExists(t, dst+".tmp")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	other := filepath.Join(t.TempDir(), "cancelled.raw")
	assert.ErrorIs(t, CopyFile(ctx, src, other, nil), context.Canceled)
	assert.NoFileExists(t, other)
	assert.NoFileExists(t, other+".tmp")
}
