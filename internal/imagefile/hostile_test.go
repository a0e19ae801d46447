package imagefile

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/test/need"
)

func needQemuImg(t *testing.T) {
	t.Helper()
	need.Tool(t, "qemu-img", "qemu-utils")
	need.Tool(t, "prlimit", "util-linux")
}

// hostSecret is what a "host file" holds: no byte of it may reach a copy.
var hostSecret = []byte("HOST-SECRET-0123456789abcdef")

// dataFileImage builds a qcow2 whose data is an external raw file of the
// host (the attack of issue 24), with the secret in that file, and applies
// patch to the image's bytes.
func dataFileImage(t *testing.T, dir string, patch func(img []byte)) string {
	t.Helper()
	host := filepath.Join(dir, "host-file")
	img := filepath.Join(dir, "evil.qcow2")
	require.NoError(t, os.WriteFile(host, nil, 0o600))
	out, err := exec.Command("qemu-img", "create", "-f", "qcow2", "-o", "data_file="+host+",data_file_raw=on", img, "1M").CombinedOutput()
	require.NoError(t, err, "%s", out)
	// Written after create, which may have truncated it: the bytes a
	// converter following data_file would copy.
	require.NoError(t, os.WriteFile(host, bytes.Repeat(hostSecret, (1<<20)/len(hostSecret)+1)[:1<<20], 0o600))
	if patch != nil {
		b, err := os.ReadFile(img)
		require.NoError(t, err)
		patch(b)
		require.NoError(t, os.WriteFile(img, b, 0o600))
	}
	return img
}

// dirHolds tells whether any file under dir other than skip holds needle.
func dirHolds(t *testing.T, dir string, skip string, needle []byte) bool {
	found := false
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == skip {
			return err
		}
		b, err := os.ReadFile(p)
		found = found || bytes.Contains(b, needle)
		return err
	}))
	return found
}

// A qcow2 with an external data file would make qemu-img copy a file of
// the host into the image: refused, whether the header says so by its
// feature bit, by its extension, or both; no byte of the file is copied.
func TestPrepareRefusesExternalDataFile(t *testing.T) {
	needQemuImg(t)
	tests := []struct {
		name  string
		patch func(img []byte)
	}{
		{name: "as qemu-img made it"},
		{name: "feature bit cleared and extension kept", patch: func(b []byte) {
			binary.BigEndian.PutUint64(b[72:], binary.BigEndian.Uint64(b[72:])&^qcow2IncompatExternalData)
		}},
		{name: "extension renamed and feature bit kept", patch: func(b []byte) {
			i := bytes.Index(b, []byte("DATA"))
			require.Positive(t, i)
			copy(b[i:], "XXXX") // an unknown extension, skipped by readers
		}},
	}
	t.Run("the attack is real", func(t *testing.T) {
		dir := t.TempDir()
		out := filepath.Join(dir, "plain.raw")
		b, err := exec.Command("qemu-img", "convert", "-f", "qcow2", "-O", "raw", dataFileImage(t, dir, nil), out).CombinedOutput()
		require.NoError(t, err, "%s", b)
		assert.True(t, dirHolds(t, dir, filepath.Join(dir, "host-file"), hostSecret), "qemu-img alone copies the host file")
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			img := dataFileImage(t, dir, tc.patch)
			out := filepath.Join(dir, "out")
			require.NoError(t, os.MkdirAll(out, 0o700))
			final := filepath.Join(out, "image.raw")
			_, err := Prepare(context.Background(), img, final, "", Limits{})
			require.ErrorIs(t, err, ErrNotAnImage)
			assert.ErrorContains(t, err, "qcow2 image with an external data file")
			assert.ErrorContains(t, err, "refused, it would read a file of the host")
			assert.NoFileExists(t, final)
			assert.False(t, dirHolds(t, out, "", hostSecret), "no byte of the host file in any output")
		})
	}
}

// qcow2Header builds a version 3 header in a 64 KiB first cluster.
func qcow2HeaderBytes(mod func(b []byte) []byte) []byte {
	b := make([]byte, 1<<16)
	copy(b, "QFI\xfb")
	be := binary.BigEndian
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], 16)    // 64 KiB clusters
	be.PutUint64(b[24:], 1<<30) // virtual size
	be.PutUint32(b[100:], 112)  // header length
	be.PutUint32(b[112:], 0)    // end of extensions
	if mod != nil {
		b = mod(b)
	}
	return b
}

func putExt(b []byte, off int, typ uint32, data string) {
	binary.BigEndian.PutUint32(b[off:], typ)
	binary.BigEndian.PutUint32(b[off+4:], uint32(len(data)))
	copy(b[off+8:], data)
}

// The header checks, on headers made by hand: the fields qemu-img would
// act on are read by Go first.
func TestQCOW2HeaderCheck(t *testing.T) {
	be := binary.BigEndian
	tests := []struct {
		name    string
		mod     func(b []byte) []byte
		limits  Limits
		wantErr string
		wantIs  error
	}{
		{name: "plain"},
		{name: "version 2", mod: func(b []byte) []byte { be.PutUint32(b[4:], 2); return b }},
		{name: "version 4", mod: func(b []byte) []byte { be.PutUint32(b[4:], 4); return b },
			wantErr: "qcow2 version 4", wantIs: ErrNotAnImage},
		{name: "truncated", mod: func(b []byte) []byte { return b[:50] }, wantErr: "truncated", wantIs: ErrNotAnImage},
		{name: "cluster bits 30", mod: func(b []byte) []byte { be.PutUint32(b[20:], 30); return b },
			wantErr: "cluster bits 30", wantIs: ErrNotAnImage},
		{name: "backing file", mod: func(b []byte) []byte {
			be.PutUint64(b[8:], 512)
			be.PutUint32(b[16:], 11)
			copy(b[512:], "/etc/shadow")
			return b
		}, wantErr: `has a backing file ("/etc/shadow")`, wantIs: ErrNotAnImage},
		{name: "data file bit", mod: func(b []byte) []byte { be.PutUint64(b[72:], qcow2IncompatExternalData); return b },
			wantErr: `external data file (data_file="")`, wantIs: ErrNotAnImage},
		{name: "data file extension after another", mod: func(b []byte) []byte {
			putExt(b, 112, 0x6803f857, "feature names, 16b")
			putExt(b, 112+8+24, qcow2ExtDataFile, "/dev/sda\x00")
			return b
		}, wantErr: `external data file (data_file="/dev/sda")`, wantIs: ErrNotAnImage},
		{name: "extension past the cluster", mod: func(b []byte) []byte {
			be.PutUint32(b[112:], 0x12345678)
			be.PutUint32(b[116:], 1<<20)
			return b
		}, wantErr: "runs past the first cluster", wantIs: ErrNotAnImage},
		{name: "encrypted", mod: func(b []byte) []byte { be.PutUint32(b[32:], 2); return b },
			wantErr: "encrypted", wantIs: ErrNotAnImage},
		{name: "16 TiB, default cap", mod: func(b []byte) []byte { be.PutUint64(b[24:], 16<<40); return b },
			wantErr: "virtual size is 16Ti (17592186044416 bytes), more than the cap of 1Ti", wantIs: ErrLimitExceeded},
		{name: "1 GiB, cap 512 MiB", limits: Limits{MaxVirtualSize: 512 << 20},
			wantErr: "more than the cap of 512Mi", wantIs: ErrLimitExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "h.qcow2")
			require.NoError(t, os.WriteFile(path, qcow2HeaderBytes(tc.mod), 0o600))
			h, err := readQCOW2Header(path)
			if err == nil {
				err = h.check(tc.limits)
			}
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			require.ErrorIs(t, err, tc.wantIs)
		})
	}
}

// A qcow2 claiming a virtual size over the cap is refused from its header,
// before qemu-img runs; so is a raw image over it.
func TestPrepareVirtualSizeCap(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge.qcow2")
	out, err := exec.Command("qemu-img", "create", "-f", "qcow2", huge, "16T").CombinedOutput()
	require.NoError(t, err, "%s", out)
	raw := writeFile(t, dir, "disk.raw", rawImage(t))
	tests := []struct {
		name    string
		src     string
		limits  Limits
		wantErr string
	}{
		{name: "16 TiB qcow2, default cap", src: huge, wantErr: "qcow2: the qcow2 image's virtual size is 16Ti"},
		{name: "8 MiB raw, 1 MiB cap", src: raw, limits: Limits{MaxVirtualSize: 1 << 20},
			wantErr: "raw: the raw image is 8Mi (8388608 bytes), more than the cap of 1Mi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			final := filepath.Join(t.TempDir(), "image.raw")
			_, err := Prepare(context.Background(), tc.src, final, "", tc.limits)
			require.ErrorIs(t, err, ErrLimitExceeded)
			assert.ErrorContains(t, err, tc.wantErr)
			var le *LimitError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, LimitVirtualSize, le.Limit)
			assert.NoFileExists(t, final)
		})
	}
}

// Decompression bombs stop at the cap: the error names it, and no more than
// the cap was written (the stage file is checked before Prepare's cleanup,
// through decompress itself).
func TestDecompressionBombStopsAtCap(t *testing.T) {
	zeros := make([]byte, 16<<20)
	limits := Limits{MaxVirtualSize: 1 << 20}
	tests := []struct {
		name   string
		format Format
		data   []byte
		nested bool // the inner stage is the bomb
	}{
		{name: "xz of zeros", format: FormatXZ, data: xzed(t, zeros)},
		{name: "gzip of zeros", format: FormatGzip, data: gzipped(t, zeros)},
		{name: "xz of xz of zeros", format: FormatXZ, data: xzed(t, xzed(t, zeros)), nested: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := writeFile(t, dir, "bomb", tc.data)
			if !tc.nested {
				dst := filepath.Join(dir, "stage")
				err := decompress(context.Background(), src, dst, tc.format, limits)
				require.ErrorIs(t, err, ErrLimitExceeded)
				assert.ErrorContains(t, err, "decompresses to more than 1114112 bytes (the virtual size cap of 1Mi")
				if st, statErr := os.Stat(dst); statErr == nil {
					assert.LessOrEqual(t, st.Size(), limits.maxDecompressed(), "written no further than the cap")
				}
			}
			final := filepath.Join(dir, "image.raw")
			_, err := Prepare(context.Background(), src, final, "", limits)
			require.ErrorIs(t, err, ErrLimitExceeded)
			assert.ErrorContains(t, err, string(tc.format)+": the "+string(tc.format)+" stream decompresses to more than")
			assert.NoFileExists(t, final)
			assert.NoFileExists(t, final+".tmp")
			assert.NoFileExists(t, final+".tmp.stage")
		})
	}
}

// Decompression, copying and checksumming stop when the context ends.
func TestPrepareHonoursCancellation(t *testing.T) {
	dir := t.TempDir()
	img := rawImage(t)
	sources := map[string][]byte{"raw": img, "xz": xzed(t, img), "gzip": gzipped(t, img)}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for name, data := range sources {
		t.Run("Prepare of "+name, func(t *testing.T) {
			src := writeFile(t, dir, name, data)
			final := filepath.Join(t.TempDir(), "image.raw")
			_, err := Prepare(cancelled, src, final, "", Limits{})
			require.ErrorIs(t, err, context.Canceled)
			assert.NoFileExists(t, final)
		})
	}
	t.Run("Checksum", func(t *testing.T) {
		_, _, err := Checksum(cancelled, writeFile(t, dir, "c.raw", img))
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("PrepareRaw", func(t *testing.T) {
		_, err := PrepareRaw(cancelled, writeFile(t, dir, "e.raw", img), filepath.Join(t.TempDir(), "x"), "")
		require.ErrorIs(t, err, context.Canceled)
	})
}

// qemu-img runs under prlimit: a file-size limit below the output stops a
// convert, and a cancelled context kills it.
func TestQemuImgRunsUnderLimits(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	raw := writeFile(t, dir, "disk.raw", rawImage(t))
	qcow := writeFile(t, dir, "disk.qcow2", qcow2Of(t, raw))
	_, err := runQemuImg(context.Background(), qemuLimits{cpuSeconds: 10, fileSize: 1 << 20},
		"convert", "-f", "qcow2", "-O", "raw", qcow, filepath.Join(dir, "out.raw"))
	require.Error(t, err)
	assert.ErrorContains(t, err, "File too large")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = runQemuImg(ctx, qemuLimits{cpuSeconds: 10}, "info", qcow)
	require.ErrorIs(t, err, context.Canceled)

	out, err := runQemuImg(context.Background(), qemuLimits{cpuSeconds: 10}, "info", "--output=json", qcow)
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(out), `"virtual-size": 8388608`), "%s", out)
}

func TestBoundedBuffer(t *testing.T) {
	b := &boundedBuffer{max: 4}
	n, err := b.Write([]byte("abc"))
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	n, err = b.Write([]byte("def"))
	require.NoError(t, err)
	assert.Equal(t, 3, n, "reported written, so the child never blocks")
	assert.Equal(t, "abcd", b.buf.String())
	assert.True(t, b.dropped)
}
