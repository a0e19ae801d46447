package backupstore

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

type discardPuts struct{ ObjectStore }

func (d discardPuts) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if len(key) > 6 && key[:6] == "packs/" {
		_, err := io.Copy(io.Discard, r)
		return err
	}
	return d.ObjectStore.Put(ctx, key, r, size)
}

func BenchmarkZZBackupCPU(b *testing.B) {
	const size = 1 << 30
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < size; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	for range b.N {
		fs, _ := NewFileStore(b.TempDir())
		tgt, err := Open(context.Background(), discardPuts{fs}, Options{})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := tgt.Backup(context.Background(), BackupInput{Volume: "v", Backup: "full", Snapshot: "s1", Size: size,
			Source: bytes.NewReader(data), MaxMemory: 4*(32<<20) + 64<<20}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(size)/(1<<20)/time.Since(start).Seconds(), "MiB/s")
	}
}
