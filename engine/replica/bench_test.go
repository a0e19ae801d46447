package replica

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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

// purgeSettle is the pause between a purge's setup and the purge. In a VM
// with free page reporting (virtio-balloon), memory left free for a couple
// of seconds goes back to the host and costs a fault per page when touched
// again. In scripts/bench-datapath the purge comes seconds after earlier
// steps freed their memory; without the pause each purge here would reuse
// the pages the previous iteration freed, and look 4x faster than there.
const purgeSettle = 3 * time.Second

// BenchmarkPurge measures what scripts/bench-datapath does: purging a
// removed snapshot holding benchSize of data into its child, which holds as
// much elsewhere, so the purge copies every block into the child's holes.
// The baseline copies the removed layer's file and fdatasyncs the copy (cp
// --sparse=always + sync --data in the script). Dirty data is synced,
// untimed, before each timed run.
func BenchmarkPurge(b *testing.B) {
	const size = 2*benchSize + 4<<20
	setup := func(b *testing.B, dir string) *Replica {
		r, err := Create(dir, size, CreateOptions{})
		require.NoError(b, err)
		// As nbdcopy writes it in the script: 256 KiB requests from four
		// connections. The page cache then holds the layer in small pieces,
		// which a purge that keeps its copy cached cannot reuse.
		chunk := make([]byte, 256<<10)
		fillRandom(chunk, 1)
		var next atomic.Int64
		errs := make(chan error, 4)
		for range 4 {
			go func() {
				for {
					off := next.Add(int64(len(chunk))) - int64(len(chunk))
					if off >= benchSize {
						errs <- nil
						return
					}
					if _, err := r.WriteAt(chunk, off); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		for range 4 {
			require.NoError(b, <-errs)
		}
		require.NoError(b, r.Snapshot("s1", SnapshotOptions{}))
		buf := bytes.Repeat([]byte{0x5a}, 1<<20)
		for off := int64(benchSize); off < 2*benchSize; off += int64(len(buf)) {
			_, err := r.WriteAt(buf, off)
			require.NoError(b, err)
		}
		require.NoError(b, r.Snapshot("s2", SnapshotOptions{}))
		require.NoError(b, r.RemoveSnapshot("s1"))
		unix.Sync()
		time.Sleep(purgeSettle)
		return r
	}
	b.Run("purge", func(b *testing.B) {
		b.SetBytes(benchSize)
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			r := setup(b, filepath.Join(b.TempDir(), fmt.Sprint(i)))
			b.StartTimer()
			if err := r.Purge(context.Background(), nil); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			require.Len(b, r.snaps, 1)
			require.NoError(b, r.Close())
			require.NoError(b, os.RemoveAll(r.dir))
			b.StartTimer()
		}
	})
	b.Run("copy-fdatasync", func(b *testing.B) {
		dir := b.TempDir()
		r := setup(b, filepath.Join(dir, "r"))
		src := filepath.Join(r.dir, r.snaps["s1"].file)
		b.SetBytes(benchSize)
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			dst := filepath.Join(dir, fmt.Sprint("copy", i))
			unix.Sync()
			b.StartTimer()
			copyFileSync(b, src, dst)
			b.StopTimer()
			require.NoError(b, os.Remove(dst))
			b.StartTimer()
		}
		require.NoError(b, r.Close())
	})
}

// copyFileSync copies src to dst in 1 MiB pieces and fdatasyncs dst.
func copyFileSync(b *testing.B, src, dst string) {
	in, err := os.Open(src)
	require.NoError(b, err)
	defer in.Close()
	out, err := os.Create(dst)
	require.NoError(b, err)
	defer out.Close()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < benchSize; off += int64(len(buf)) {
		require.NoError(b, readFull(in, buf, off))
		_, err := out.WriteAt(buf, off)
		require.NoError(b, err)
	}
	require.NoError(b, unix.Fdatasync(int(out.Fd())))
}

// BenchmarkOpenWithMarks measures Open of a replica whose head zeroed
// benchSize over a snapshot (write-zeroes through the CSI node path): zero
// marks over holes (zeromarks.go), marked discarded. Open checks the
// discard marks against the head's data, of which there is none to read.
// The baseline is the same replica with its discard file removed.
func BenchmarkOpenWithMarks(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "r")
	r, err := Create(dir, benchSize, CreateOptions{})
	require.NoError(b, err)
	p := bytes.Repeat([]byte{1}, 1<<20)
	for off := int64(0); off < benchSize; off += int64(len(p)) {
		_, err := r.WriteAt(p, off)
		require.NoError(b, err)
	}
	require.NoError(b, r.Snapshot("s", SnapshotOptions{}))
	require.NoError(b, r.WriteZeroes(0, benchSize))
	marks := filepath.Join(dir, discardFileName(r.head.file))
	require.NoError(b, r.Close())
	saved, err := os.ReadFile(marks)
	require.NoError(b, err)
	for _, tc := range []struct {
		name  string
		marks bool
	}{{"no-marks", false}, {"256MiB-marked", true}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				os.Remove(marks)
				if tc.marks {
					require.NoError(b, os.WriteFile(marks, saved, fileMode))
				}
				r, err := Open(dir)
				require.NoError(b, err)
				require.NoError(b, r.Close())
			}
		})
	}
}
