package backupstore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Damage is the failure tests: restore and verify must name the chunk and
// never write zeroes in its place.

func damagedEnv(t *testing.T) (*env, *Manifest) {
	e := newEnv(t, 4*testChunk)
	size := int64(16 * testChunk)
	data := volume(11, size)
	m := e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: size, Source: bytes.NewReader(data)})
	return e, m
}

func entryAt(m *Manifest, index int64) Entry {
	for _, e := range m.Entries {
		if e.Index == index {
			return e
		}
	}
	panic("no entry")
}

func TestFlippedByteFailsRestoreAndVerifyNamingTheChunk(t *testing.T) {
	e, m := damagedEnv(t)
	victim := entryAt(m, 6)
	p := filepath.Join(e.dir, filepath.FromSlash(packKey(m.Packs[victim.Pack])))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	b[victim.Offset+uint64(victim.CLen)/2] ^= 0x40
	require.NoError(t, os.WriteFile(p, b, 0o644))

	_, err = restore(t, e.tgt, m, nil, RestoreOptions{})
	var ce *ChunkError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, int64(6), ce.Index)
	assert.ErrorIs(t, err, ErrChecksum)
	assert.Contains(t, err.Error(), "backup b1 of volume v1: chunk 6 (offset 393216, id "+victim.Chunk.String())
	assert.Contains(t, err.Error(), "in pack "+m.Packs[victim.Pack].String())

	rep, err := e.tgt.Verify(context.Background(), m, 2)
	require.Error(t, err)
	require.Len(t, rep.Bad, 1)
	assert.Equal(t, int64(6), rep.Bad[0].Index)
	assert.Equal(t, int64(len(m.Entries)), rep.Chunks)
}

func TestMissingPackFailsNamingIt(t *testing.T) {
	e, m := damagedEnv(t)
	gone := m.Packs[entryAt(m, 0).Pack]
	require.NoError(t, os.Remove(filepath.Join(e.dir, filepath.FromSlash(packKey(gone)))))

	_, err := restore(t, e.tgt, m, nil, RestoreOptions{})
	var ce *ChunkError
	require.ErrorAs(t, err, &ce)
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Equal(t, gone, ce.Pack)
	assert.Contains(t, err.Error(), gone.String())

	rep, err := e.tgt.Verify(context.Background(), m, 2)
	require.Error(t, err)
	assert.NotEmpty(t, rep.Bad)
	for _, b := range rep.Bad {
		assert.Equal(t, gone, b.Pack)
	}
}

func TestTruncatedPackFails(t *testing.T) {
	e, m := damagedEnv(t)
	last := m.Entries[len(m.Entries)-1]
	p := filepath.Join(e.dir, filepath.FromSlash(packKey(m.Packs[last.Pack])))
	require.NoError(t, os.Truncate(p, int64(last.Offset)+10))
	_, err := restore(t, e.tgt, m, nil, RestoreOptions{})
	var ce *ChunkError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "unexpected EOF")
}

func TestBackupReuploadsChunksOfAVanishedPack(t *testing.T) {
	e := newEnv(t, 4*testChunk)
	size := int64(8 * testChunk)
	data := volume(12, size)
	base := e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: size, Source: bytes.NewReader(data)})
	// The pack goes but its index object stays, as if a GC raced us: the
	// next backup must notice before writing its manifest.
	gone := base.Packs[0]
	require.NoError(t, os.Remove(filepath.Join(e.dir, filepath.FromSlash(packKey(gone)))))
	m := e.backup(BackupInput{Volume: "v1", Backup: "b2", Size: size, Source: bytes.NewReader(data), Changed: []Range{}, Base: base})
	// Packs are content-addressed: the same chunks repacked give the same
	// pack again, so the id may well reappear — what matters is it exists.
	for _, p := range m.Packs {
		_, err := e.files.Stat(context.Background(), packKey(p))
		require.NoError(t, err)
	}
	assert.Positive(t, m.Stats.NewChunks)
	got, err := restore(t, e.tgt, m, nil, RestoreOptions{})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
}
