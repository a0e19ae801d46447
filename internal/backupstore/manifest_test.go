package backupstore

import (
	"crypto/sha256"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleManifest() *Manifest {
	m := &Manifest{Header: Header{Format: FormatVersion, Volume: "v1", Backup: "b1", Snapshot: "s1",
		Created: time.Unix(1700000000, 0).UTC(), VolumeSize: 10*testChunk + 5, ChunkSize: testChunk,
		BackingImage: &BackingImage{Name: "img", Checksum: "c"}}}
	m.Packs = []PackID{{1}, {2}}
	m.Entries = []Entry{
		{Index: 0, Kind: KindBacking},
		{Index: 2, Kind: KindData, Chunk: ChunkID{9}, Pack: 1, Offset: 8, CLen: 100, Codec: CodecZstd},
		{Index: 10, Kind: KindData, Chunk: ChunkID{8}, Pack: 0, Offset: 1 << 20, CLen: 5, Codec: CodecRaw},
	}
	return m
}

func TestManifestRoundTrip(t *testing.T) {
	m := sampleManifest()
	data, err := m.Marshal()
	require.NoError(t, err)
	got, err := ParseManifest(data)
	require.NoError(t, err)
	assert.Equal(t, m, got)
	_, need, err := ParseHeader(data[:12])
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	h, n, err := ParseHeader(data[:need])
	require.NoError(t, err)
	assert.Equal(t, "b1", h.Backup)
	assert.Equal(t, need, n)
}

func TestParseManifestRejectsDamage(t *testing.T) {
	data, err := sampleManifest().Marshal()
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"truncated", data[:len(data)-1], "checksum mismatch"},
		{"flipped", flip(data, 30), "checksum mismatch"},
		{"bad magic", reseal(flip(data[:len(data)-32], 0)), "bad magic"},
		{"bad header", reseal(flip(data[:len(data)-32], 14)), "header"},
		{"table cut", reseal(data[:len(data)-40]), "chunk table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseManifest(tc.data)
			assert.ErrorIs(t, err, ErrCorruptManifest)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func flip(b []byte, i int) []byte {
	out := append([]byte(nil), b...)
	out[i] ^= 0xff
	return out
}

// reseal appends a valid checksum so the parser reaches the body.
func reseal(body []byte) []byte {
	sum := sha256.Sum256(body)
	return append(append([]byte(nil), body...), sum[:]...)
}

func TestManifestOfOneTiBStaysSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 1M-chunk manifest")
	}
	m := &Manifest{Header: Header{Format: FormatVersion, Volume: "v", Backup: "b", VolumeSize: 1 << 40, ChunkSize: 1 << 20}}
	for p := range 1 << 15 { // 32 MiB packs of 1 MiB chunks
		m.Packs = append(m.Packs, PackID(sha256.Sum256([]byte{byte(p), byte(p >> 8)})))
	}
	for i := range int64(1 << 20) {
		m.Entries = append(m.Entries, Entry{Index: i, Kind: KindData, Chunk: ChunkID(sha256.Sum256([]byte{byte(i), byte(i >> 8), byte(i >> 16)})),
			Pack: uint32(i >> 5), Offset: 8 + uint64(i&31)*(1<<20), CLen: 1 << 20})
	}
	data, err := m.Marshal()
	require.NoError(t, err)
	t.Logf("manifest of a fully written 1 TiB volume: %.1f MiB", float64(len(data))/(1<<20))
	assert.Less(t, len(data), 40<<20)
}

func FuzzParseManifest(f *testing.F) {
	data, _ := sampleManifest().Marshal()
	f.Add(data)
	f.Add(data[:len(data)-32])
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, reseal(b)} {
			m, err := ParseManifest(in)
			if err != nil {
				continue
			}
			out, err := m.Marshal()
			require.NoError(t, err)
			again, err := ParseManifest(out)
			require.NoError(t, err)
			require.Equal(t, m.Entries, again.Entries)
		}
	})
}
