package backupstore

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkBackup backs up a 256 MiB random volume, then the same volume
// after 10% of it was rewritten in scattered 64 KiB writes, for each chunk
// and pack size, and reports per GiB of volume the objects written and
// requests made (docs/backupstore.md uses these figures):
//
//	go test -run='^$' -bench=Backup -benchtime=1x ./internal/backupstore/
func BenchmarkBackup(b *testing.B) {
	const size = 256 << 20
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < size; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	after := append([]byte(nil), data...)
	changed := scatteredWrites(r, after, size/10, 64<<10)
	for _, chunk := range []int64{512 << 10, 1 << 20, 4 << 20} {
		for _, pack := range []int64{16 << 20, 32 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("chunk=%dKiB/pack=%dMiB", chunk>>10, pack>>20), func(b *testing.B) {
				for range b.N {
					benchOne(b, chunk, pack, data, after, changed)
				}
			})
		}
	}
}

func scatteredWrites(r *rand.Rand, data []byte, total, n int) []Range {
	var out []Range
	for done := 0; done < total; done += n {
		off := r.IntN(len(data)/n) * n
		for i := off; i < off+n; i++ {
			data[i] = byte(r.Uint32())
		}
		out = append(out, Range{int64(off), int64(n)})
	}
	return out
}

func benchOne(b *testing.B, chunk, pack int64, data, after []byte, changed []Range) {
	ctx := context.Background()
	fs, err := NewFileStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	cs := NewCountingStore(fs)
	tgt, err := Open(ctx, cs, Options{ChunkSize: chunk, PackSize: pack})
	if err != nil {
		b.Fatal(err)
	}
	perGiB := float64(1<<30) / float64(len(data))
	start := time.Now()
	base, err := tgt.Backup(ctx, BackupInput{Volume: "v", Backup: "full", Snapshot: "s1", Size: int64(len(data)),
		Source: bytes.NewReader(data), MaxMemory: 4*pack + 64<<20})
	if err != nil {
		b.Fatal(err)
	}
	full := time.Since(start)
	b.ReportMetric(float64(len(data))/(1<<20)/full.Seconds(), "full-MiB/s")
	b.ReportMetric(float64(cs.Writes())*perGiB, "full-objects/GiB")
	b.ReportMetric(float64(cs.Requests())*perGiB, "full-requests/GiB")
	cs.Reset()
	start = time.Now()
	m, err := tgt.Backup(ctx, BackupInput{Volume: "v", Backup: "incr", Snapshot: "s2", Size: int64(len(data)),
		Source: bytes.NewReader(after), Changed: changed, Base: base, MaxMemory: 4*pack + 64<<20})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(time.Since(start).Seconds(), "incr-s")
	b.ReportMetric(float64(cs.Writes())*perGiB, "incr-objects/GiB")
	b.ReportMetric(float64(m.Stats.NewBytes)*perGiB/(1<<20), "incr-uploadMiB/GiB")
	b.ReportMetric(float64(cs.Requests())*perGiB, "incr-requests/GiB")
	cs.Reset()
	start = time.Now()
	d := &memDst{buf: make([]byte, len(data))}
	if err := tgt.Restore(ctx, m, d, nil, RestoreOptions{}); err != nil {
		b.Fatal(err)
	}
	if !bytes.Equal(d.buf, after) {
		b.Fatal("restored volume differs")
	}
	b.ReportMetric(float64(len(data))/(1<<20)/time.Since(start).Seconds(), "restore-MiB/s")
	b.ReportMetric(float64(cs.Requests())*perGiB, "restore-requests/GiB")
}
