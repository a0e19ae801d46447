package imserver

import (
	"bytes"
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

const (
	backedSize = 4 * mib
	imageSize  = mib + 1000 // shorter than the volume, not whole blocks
)

// writeImage writes a raw image: random 64 KiB stretches and holes (never
// written). It returns the image's content and how many bytes hold data.
func writeImage(t *testing.T, path string, seed int64) ([]byte, int64) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	img := make([]byte, imageSize)
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	var data int64
	for off := int64(0); off < imageSize; off += 64 << 10 {
		if rng.Intn(3) == 0 {
			continue
		}
		p := img[off:min(off+64<<10, imageSize)]
		rng.Read(p)
		_, err := f.WriteAt(p, off)
		require.NoError(t, err)
		data += int64(len(p))
	}
	require.NoError(t, f.Truncate(imageSize))
	return img, data
}

// backedVolume is an engine whose one replica sits on a backing file.
func (im *testIM) backedVolume(t *testing.T, name, backing string) (*replication.Engine, string) {
	t.Helper()
	req := replicaReq(name+"-r", im.replicaDir(name+"-r"), backedSize)
	req.BackingFile = backing
	r, err := im.c.InstanceCreate(context.Background(), req)
	require.NoError(t, err)
	_, err = im.c.InstanceCreate(context.Background(), engineReq(name+"-e", backedSize, map[string]string{name + "-r": r.Address}))
	require.NoError(t, err)
	return im.engine(t, name+"-e"), r.Address
}

// Export and clone of a snapshot of a volume on a backing file: the image's
// bytes are part of the snapshot, zeros past its end. A clone copies them,
// or with BackingShared leaves them to the target's own copy of the image.
func TestExportAndCloneOverBackingFile(t *testing.T) {
	ctx := context.Background()
	im := newTestIM(t, Options{})
	dir := t.TempDir()
	image := filepath.Join(dir, "image.raw")
	img, imageData := writeImage(t, image, 1)
	imageCopy := filepath.Join(dir, "image-copy.raw")
	require.NoError(t, os.WriteFile(imageCopy, img, 0o644))
	other := filepath.Join(dir, "other.raw")
	writeImage(t, other, 2)
	shorter := filepath.Join(dir, "shorter.raw")
	require.NoError(t, os.WriteFile(shorter, img[:imageSize-4096], 0o644))

	src, srcAddr := im.backedVolume(t, "src", image)
	want := make([]byte, backedSize)
	copy(want, img)
	write := func(p []byte, off int64) {
		_, err := src.WriteAt(p, off)
		require.NoError(t, err)
		copy(want[off:], p)
	}
	write(pattern(0xa1, 256<<10), 512<<10)
	write(pattern(0xa2, 100), 2*mib) // past the image
	require.NoError(t, src.WriteZeroes(64<<10, 8<<10))
	clear(want[64<<10 : 72<<10])
	_, err := im.c.SnapshotCreate(ctx, "src-e", "s1", true, nil, 0)
	require.NoError(t, err)
	_, err = src.WriteAt(pattern(0xff, mib), 0) // the head moves on; s1 does not see it
	require.NoError(t, err)

	got := make([]byte, backedSize)
	require.NoError(t, im.c.SnapshotExport(ctx, "src-e", "s1", func(c *impb.ExportChunk) error {
		copy(got[c.Offset:], c.Data)
		return nil
	}))
	require.True(t, bytes.Equal(want, got), "the export is the image with s1's writes over it")

	plain, plainAddr := im.backedVolume(t, "plain", "")
	_, err = plain.WriteAt(pattern(1, 4096), 0)
	require.NoError(t, err)
	_, err = im.c.SnapshotCreate(ctx, "plain-e", "p1", true, nil, 0)
	require.NoError(t, err)

	tests := []struct {
		name          string
		backing       string // the target's
		shared        bool
		leftovers     bool // the target's head holds data of an earlier attempt
		source        string
		wantErr       error
		imageNotTaken bool // the image's data must not have been copied
	}{
		{name: "copied into a volume without backing file", source: srcAddr},
		{name: "shared with a copy of the image", backing: imageCopy, shared: true, source: srcAddr, imageNotTaken: true},
		{name: "shared, over an earlier attempt's data", backing: imageCopy, shared: true, leftovers: true, source: srcAddr},
		{name: "copied into a volume on another image", backing: other, source: srcAddr},
		{name: "shared into a volume without backing file", shared: true, source: srcAddr, wantErr: engineapi.ErrInvalid},
		{name: "shared with an image of another size", backing: shorter, shared: true, source: srcAddr, wantErr: engineapi.ErrInvalid},
		{name: "shared from a source without backing file", backing: imageCopy, shared: true, source: plainAddr, wantErr: engineapi.ErrInvalid},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := "t" + string(rune('a'+i))
			dst, _ := im.backedVolume(t, name, tc.backing)
			if tc.leftovers {
				_, err := dst.WriteAt(pattern(0x55, backedSize), 0)
				require.NoError(t, err)
			}
			snap := "s1"
			if tc.source == plainAddr {
				snap = "p1"
			}
			err := im.c.SnapshotClone(ctx, engineapi.SnapshotCloneArgs{Engine: name + "-e",
				SourceAddress: tc.source, Snapshot: snap, BackingShared: tc.shared})
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, readAt(t, dst, 0, backedSize)), "the clone reads as s1")
			if tc.imageNotTaken {
				chain, err := dst.Chain(ctx)
				require.NoError(t, err)
				assert.Less(t, chain.Layers[replicactl.HeadName].Size, imageData,
					"only s1's own blocks were written, not the image's")
			}
		})
	}
}
