package replication

import (
	"bytes"
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	disk "github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engine/replicactl"
)

// writeBackingImage writes a raw image of size bytes: random data in some
// 64 KiB stretches, holes (never written) in the others.
func writeBackingImage(t *testing.T, path string, size int64, seed int64) []byte {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	img := make([]byte, size)
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	for off := int64(0); off < size; off += 64 << 10 {
		if rng.Intn(3) == 0 {
			continue
		}
		p := img[off:min(off+64<<10, size)]
		rng.Read(p)
		_, err := f.WriteAt(p, off)
		require.NoError(t, err)
	}
	require.NoError(t, f.Truncate(size))
	return img
}

// A rebuild copies snapshots, not the backing file: the target must sit on
// a copy of the source's image (at a path of its own), and then reads as
// the source does, also after writes the copy ran alongside (partial blocks
// over the image, zeroing and trims of blocks only the image holds). A
// target without a backing file, or with one of another size, is refused
// before it joins.
func TestRebuildOnBackingFile(t *testing.T) {
	const size = 4 << 20
	const imageSize = 1<<20 + 1000 // shorter than the volume, not whole blocks
	dir := t.TempDir()
	image := filepath.Join(dir, "image.raw")
	data := writeBackingImage(t, image, imageSize, 3)
	imageCopy := filepath.Join(dir, "copy-on-another-disk.raw")
	require.NoError(t, os.WriteFile(imageCopy, data, 0o644))
	shorter := filepath.Join(dir, "shorter.raw")
	require.NoError(t, os.WriteFile(shorter, data[:imageSize-4096], 0o644))

	tests := []struct {
		name    string
		backing string // the target's
		wantErr error
	}{
		{"a copy of the image", imageCopy, nil},
		{"no backing file", "", replicactl.ErrBackingMismatch},
		{"an image of another size", shorter, replicactl.ErrBackingMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := New("vol", size, quietLog(), nil)
			src := serveReplicaWith(t, "r-src", size, disk.CreateOptions{BackingFile: image})
			require.NoError(t, e.AddReplica(src.name, src.addr, dialT(t, src.addr), ModeRW))
			_, err := e.WriteAt(bytes.Repeat([]byte{0xa1}, 256<<10), 512<<10) // over the image
			require.NoError(t, err)
			require.NoError(t, e.WriteZeroes(64<<10, 8<<10)) // zero blocks hiding the image
			require.NoError(t, e.Snapshot(ctx, "s1", SnapshotOptions{UserCreated: true}))
			_, err = e.WriteAt(bytes.Repeat([]byte{0xa2}, 100), 2<<20) // past the image
			require.NoError(t, err)

			target := serveReplicaWith(t, "r-t", size, disk.CreateOptions{BackingFile: tc.backing})
			// While the copy runs, writes the target can resolve only
			// against the image.
			var once sync.Once
			var hookErr error
			opts := RebuildOptions{Replica: target.name, Address: target.addr, Target: dialT(t, target.addr),
				Dial: func(ctx context.Context, addr string) (Backend, error) {
					b, err := dialBackend(ctx, addr)
					if err != nil || addr != src.addr {
						return b, err
					}
					return &hooked{Backend: b, control: func(method string) error {
						if method == replicactl.ReadLayer {
							once.Do(func() { hookErr = writeOverImage(e) })
						}
						return nil
					}}, nil
				}}
			err = e.Rebuild(ctx, opts)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				_, _, attached := e.Backend(target.name)
				assert.False(t, attached, "a refused target never joins")
				assert.False(t, target.rep.Importing(), "nor is it left importing")
				return
			}
			require.NoError(t, err)
			require.NoError(t, hookErr)

			want := readDevice(t, src.rep)
			require.NoError(t, e.RemoveReplica(src.name))
			assert.True(t, bytes.Equal(want, readDevice(t, e)), "the rebuilt replica alone reads as the source")
			assert.True(t, bytes.Equal(data[800<<10:1000<<10], want[800<<10:1000<<10]),
				"the image shows where nothing was written")
		})
	}
}

// writeOverImage makes writes a replica must resolve against its backing
// file: a partial block and zeroing over blocks only the image holds, and
// a trim of some.
func writeOverImage(e *Engine) error {
	if _, err := e.WriteAt([]byte("partial"), 128<<10+10); err != nil {
		return err
	}
	if err := e.WriteZeroes(192<<10+100, 3000); err != nil {
		return err
	}
	if _, err := e.WriteAt(bytes.Repeat([]byte{0xa3}, 5000), 1<<20-2000); err != nil { // across the image's end
		return err
	}
	if _, err := e.WriteAt(bytes.Repeat([]byte{0xa4}, 8192), 320<<10); err != nil {
		return err
	}
	return e.Unmap(320<<10, 8192)
}
