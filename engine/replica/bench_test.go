package replica

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

const benchSize = 256 << 20

// BenchmarkReadWrite measures the replica, and a raw file as the baseline,
// on sequential 1 MiB writes and reads and 4 KiB random reads. The layered
// case spreads the data over a backing-free chain of three snapshots and
// the head, so reads switch layers every few blocks.
func BenchmarkReadWrite(b *testing.B) {
	devices := []struct {
		name string
		open func(b *testing.B) blockdev.Device
	}{
		{"raw", func(b *testing.B) blockdev.Device {
			f, err := blockdev.OpenFile(filepath.Join(b.TempDir(), "raw"), benchSize)
			require.NoError(b, err)
			b.Cleanup(func() { f.Close() })
			return f
		}},
		{"replica", func(b *testing.B) blockdev.Device {
			r, err := Create(filepath.Join(b.TempDir(), "r"), benchSize, CreateOptions{})
			require.NoError(b, err)
			b.Cleanup(func() { r.Close() })
			return r
		}},
		{"replica-4-layers", func(b *testing.B) blockdev.Device {
			r, err := Create(filepath.Join(b.TempDir(), "r"), benchSize, CreateOptions{})
			require.NoError(b, err)
			b.Cleanup(func() { r.Close() })
			p := make([]byte, bs)
			for layer := range 4 {
				for blk := int64(layer); blk < benchSize/bs; blk += 4 + int64(layer) {
					_, err := r.WriteAt(p, blk*bs)
					require.NoError(b, err)
				}
				if layer < 3 {
					require.NoError(b, r.Snapshot("s"+string(rune('a'+layer)), SnapshotOptions{}))
				}
			}
			return r
		}},
	}
	for _, d := range devices {
		b.Run(d.name, func(b *testing.B) {
			dev := d.open(b)
			buf := make([]byte, 1<<20)
			fillRandom(buf, 1)
			fill := func() {
				for off := int64(0); off < benchSize; off += int64(len(buf)) {
					_, err := dev.WriteAt(buf, off)
					require.NoError(b, err)
				}
			}
			if d.name != "replica-4-layers" {
				fill()
			}
			b.Run("seq-read-1M", func(b *testing.B) {
				b.SetBytes(int64(len(buf)))
				off := int64(0)
				for b.Loop() {
					if _, err := dev.ReadAt(buf, off); err != nil {
						b.Fatal(err)
					}
					off = (off + int64(len(buf))) % benchSize
				}
			})
			b.Run("rand-read-4K", func(b *testing.B) {
				b.SetBytes(bs)
				rng := rand.New(rand.NewPCG(1, 2))
				p := buf[:bs]
				for b.Loop() {
					if _, err := dev.ReadAt(p, rng.Int64N(benchSize/bs)*bs); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("seq-write-1M", func(b *testing.B) {
				b.SetBytes(int64(len(buf)))
				off := int64(0)
				for b.Loop() {
					if _, err := dev.WriteAt(buf, off); err != nil {
						b.Fatal(err)
					}
					off = (off + int64(len(buf))) % benchSize
				}
			})
			b.Run("rand-write-4K", func(b *testing.B) {
				b.SetBytes(bs)
				rng := rand.New(rand.NewPCG(3, 4))
				p := buf[:bs]
				for b.Loop() {
					if _, err := dev.WriteAt(p, rng.Int64N(benchSize/bs)*bs); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
