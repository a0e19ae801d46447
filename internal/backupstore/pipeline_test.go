package backupstore

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A chunk is stored compressed only when that saves a 64th of it; a chunk
// whose first 64 KiB do not compress is stored raw without compressing the
// rest (the price: a chunk random at its start and compressible after it
// is stored raw too).
func TestCompressChoosesTheCodec(t *testing.T) {
	random := func(n int) []byte {
		b := make([]byte, n)
		r := rand.New(rand.NewPCG(7, 7))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	text := bytes.Repeat([]byte("strata keeps every volume as a chain of snapshot layers. "), 1<<20/57+1)[:1<<20]
	randomThenText := append(random(compressSample), text[compressSample:]...)
	tgt := newEnv(t, 0).tgt
	for _, tc := range []struct {
		name string
		raw  []byte
		want Codec
	}{
		{"random 1 MiB chunk", random(1 << 20), CodecRaw},
		{"text 1 MiB chunk", text, CodecZstd},
		{"random start, text after: the sample decides", randomThenText, CodecRaw},
		{"small text chunk (no sample)", text[:100<<10], CodecZstd},
		{"small random chunk", random(100 << 10), CodecRaw},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, ok := tgt.compressed(tc.raw)
			assert.Equal(t, tc.want == CodecZstd, ok)
			if !ok {
				return
			}
			assert.Less(t, len(data), len(tc.raw))
			back, err := tgt.dec.DecodeAll(data, make([]byte, 0, len(tc.raw))) // capped as a restore caps it
			assert.NoError(t, err)
			assert.Equal(t, tc.raw, back)
		})
	}
}
