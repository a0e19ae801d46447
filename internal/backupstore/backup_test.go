package backupstore

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFullBackupRestoresByteEqual(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int64
		pack int64
	}{
		{"one pack", 20*testChunk + 1234, 64 << 20},
		{"many packs", 40*testChunk + 7, 4 * testChunk},
		{"one short chunk", 777, testChunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.pack)
			data := volume(1, tc.size)
			m := e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: tc.size, Source: bytes.NewReader(data)})
			got, err := restore(t, e.tgt, m, nil, RestoreOptions{})
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, got), "restored volume differs")

			// A new process reads the manifest from the target alone.
			m2, err := e.reopen().LoadManifest(context.Background(), "v1", "b1")
			require.NoError(t, err)
			assert.Equal(t, m.Entries, m2.Entries)
			assert.Zero(t, len(e.objects(inflightPfx)), "inflight marker left behind")
		})
	}
}

func TestHolesAreNotStored(t *testing.T) {
	e := newEnv(t, 64<<20)
	size := int64(10 * testChunk)
	data := volume(2, size)
	m := e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: size, Source: bytes.NewReader(data)})
	// volume() zeroes chunks 3 and 8.
	assert.Equal(t, int64(8), m.Stats.DataChunks)
	for _, en := range m.Entries {
		assert.NotContains(t, []int64{3, 8}, en.Index)
	}
	got, err := restore(t, e.tgt, m, nil, RestoreOptions{WriteZeroes: true})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
}

func TestIncrementalReadsOnlyChangedChunks(t *testing.T) {
	e := newEnv(t, 64<<20)
	size := int64(32 * testChunk)
	data := volume(3, size)
	base := e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: size, Source: bytes.NewReader(data)})

	// Change two ranges: inside chunk 5, and across chunks 20-21.
	copy(data[5*testChunk+10:], bytes.Repeat([]byte{7}, 100))
	copy(data[21*testChunk-50:], bytes.Repeat([]byte{9}, 100))
	changed := []Range{{5*testChunk + 10, 100}, {21*testChunk - 50, 100}}
	src := &recordingReader{r: bytes.NewReader(data)}
	e.count.Reset()
	m := e.backup(BackupInput{Volume: "v1", Backup: "b2", Size: size, Source: src, Changed: changed, Base: base})

	assert.Equal(t, []int64{5 * testChunk, 20 * testChunk, 21 * testChunk}, src.offsets())
	assert.Equal(t, int64(3), m.Stats.NewChunks)
	assert.Equal(t, []string{"", "b1"}, []string{base.Base, m.Base}, "the manifest names its base")
	cs := e.count.Counts()
	assert.Equal(t, int64(3), cs["Put"].Calls, "one pack, its index and the inflight marker")
	assert.Equal(t, int64(1), cs["PutIfAbsent"].Calls, "the manifest")
	got, err := restore(t, e.tgt, m, nil, RestoreOptions{})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
}

func TestFirstBackupWithChangedRangesLeavesTheRestAsHoles(t *testing.T) {
	e := newEnv(t, 64<<20)
	size := int64(8 * testChunk)
	data := make([]byte, size)
	copy(data[2*testChunk:], volume(4, testChunk))
	src := &recordingReader{r: bytes.NewReader(data)}
	m := e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: size, Source: src, Changed: []Range{{2 * testChunk, testChunk}}})
	assert.Equal(t, []int64{2 * testChunk}, src.offsets())
	got, err := restore(t, e.tgt, m, nil, RestoreOptions{})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
}

func TestDedupAcrossVolumes(t *testing.T) {
	e := newEnv(t, 64<<20)
	size := int64(16 * testChunk)
	data := volume(5, size)
	e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: size, Source: bytes.NewReader(data)})
	// Another process, another volume, the same content: nothing new.
	e.tgt = e.reopen()
	e.count.Reset()
	m := e.backup(BackupInput{Volume: "v2", Backup: "b1", Size: size, Source: bytes.NewReader(data)})
	assert.Zero(t, m.Stats.NewChunks)
	assert.Zero(t, m.Stats.NewPacks)
	assert.Equal(t, int64(1), e.count.Counts()["Put"].Calls, "only the inflight marker")
	for _, k := range []string{"GetRange"} {
		assert.Zero(t, e.count.Counts()[k].Calls, "dedupe must not read packs")
	}
	got, err := restore(t, e.tgt, m, nil, RestoreOptions{})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
}

func TestBackingRangesAreNeverUploaded(t *testing.T) {
	e := newEnv(t, 64<<20)
	size := int64(12 * testChunk)
	image := volume(6, 8*testChunk)
	data := volume(7, size)
	copy(data, image)
	copy(data[2*testChunk+5:], []byte("changed")) // chunk 2 of the image was written to
	bi := &BackingImage{Name: "img", URL: "http://example/img", Checksum: "abc"}
	src := &recordingReader{r: bytes.NewReader(data)}
	untouched := []Range{{0, 2 * testChunk}, {3 * testChunk, 5 * testChunk}}
	m := e.backup(BackupInput{Volume: "v1", Backup: "b1", Size: size, Source: src, Backing: untouched, BackingImage: bi})

	assert.Equal(t, int64(7), m.Stats.BackingChunks)
	for _, off := range src.offsets() {
		assert.False(t, off < 8*testChunk && off != 2*testChunk, "read backing chunk at %d", off)
	}
	for _, en := range m.Entries {
		if en.Kind == KindData && en.Index < 8 {
			assert.Equal(t, int64(2), en.Index)
		}
	}
	got, err := restore(t, e.tgt, m, image, RestoreOptions{})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))

	_, err = restore(t, e.tgt, m, nil, RestoreOptions{})
	assert.ErrorContains(t, err, "backing image img")

	// Over a layer that already has the image, backing chunks are skipped.
	onImage := make([]byte, size)
	copy(onImage, image)
	d := &memDst{buf: onImage}
	require.NoError(t, e.tgt.Restore(context.Background(), m, d, nil, RestoreOptions{BackingAlreadyThere: true}))
	assert.True(t, bytes.Equal(data, d.buf))
}

func TestBackupExistsIsRefused(t *testing.T) {
	e := newEnv(t, 64<<20)
	data := volume(8, 4*testChunk)
	in := BackupInput{Volume: "v1", Backup: "b1", Snapshot: "s", Size: int64(len(data)), Source: bytes.NewReader(data)}
	e.backup(in)
	_, err := e.tgt.Backup(context.Background(), in)
	require.ErrorIs(t, err, ErrExists)
	assert.EqualError(t, err, "backup b1 of volume v1 already exists on the target: object already exists")
}

func TestBackupInputErrorsNameTheField(t *testing.T) {
	e := newEnv(t, 64<<20)
	src := bytes.NewReader(make([]byte, 10))
	for _, tc := range []struct {
		in   BackupInput
		want string
	}{
		{BackupInput{Volume: "V/1", Backup: "b", Snapshot: "s", Size: 10, Source: src}, `volume "V/1"`},
		{BackupInput{Volume: "v", Backup: "", Snapshot: "s", Size: 10, Source: src}, `backup ""`},
		// DNS-1123, as the API server: no empty label between dots.
		{BackupInput{Volume: "a..b", Backup: "b", Snapshot: "s", Size: 10, Source: src}, `volume "a..b"`},
		{BackupInput{Volume: "v", Backup: "b.-c", Snapshot: "s", Size: 10, Source: src}, `backup "b.-c"`},
		{BackupInput{Volume: "v", Backup: "b", Snapshot: "../s", Size: 10, Source: src}, `snapshot: `},
		{BackupInput{Volume: "v", Backup: "b", Snapshot: "s", Size: 0, Source: src}, "size 0"},
		{BackupInput{Volume: "v", Backup: "b", Snapshot: "s", Size: 10}, "source: required"},
		{BackupInput{Volume: "v", Backup: "b", Snapshot: "s", Size: 10, Source: src, Backing: []Range{{0, 10}}}, "backingImage: required"},
		{BackupInput{Volume: "v", Backup: "b", Snapshot: "s", Size: 10, Source: src, MaxMemory: 1 << 20}, "maxMemory 1048576"},
	} {
		_, err := e.tgt.Backup(context.Background(), tc.in)
		assert.ErrorContains(t, err, tc.want)
	}
}

// A snapshot name the replicas accept (types.ValidateSnapshotName: upper
// case included) is backed up: it is recorded in the manifest, no key.
func TestSnapshotNamesAreTheDataPlanes(t *testing.T) {
	e := newEnv(t, 64<<20)
	data := make([]byte, 10)
	_, err := e.tgt.Backup(context.Background(), BackupInput{Volume: "v", Backup: "b", Snapshot: "Daily-0700",
		Size: int64(len(data)), Source: bytes.NewReader(data)})
	require.NoError(t, err)
}

func TestCancelledBackupLeavesNoManifestAndGCWaitsForGrace(t *testing.T) {
	e := newEnv(t, 2*testChunk)
	size := int64(64 * testChunk)
	data := volume(9, size)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := e.tgt.Backup(ctx, BackupInput{Volume: "v1", Backup: "b1", Snapshot: "s", Size: size, Concurrency: 1,
		Source: bytes.NewReader(data),
		Progress: func(done, total int64) {
			if done >= total/2 {
				cancel()
			}
		},
	})
	require.True(t, errors.Is(err, context.Canceled), "err = %v", err)
	assert.Empty(t, e.objects(backupsPrefix))
	packs := e.objects(packsPrefix)
	require.NotEmpty(t, packs, "the crash should leave packs behind")

	// Another volume's backup keeps the target non-empty, so GC may run.
	other := volume(10, 2*testChunk)
	e.backup(BackupInput{Volume: "v2", Backup: "b1", Size: int64(len(other)), Source: bytes.NewReader(other)})
	now := packs[len(packs)-1].ModTime
	rep, err := e.tgt.GC(context.Background(), GCOptions{Grace: time.Hour, Now: now.Add(time.Minute)})
	require.NoError(t, err)
	assert.Zero(t, rep.PacksDeleted, "within grace")
	assert.Equal(t, len(packs), rep.PacksYoung)

	rep, err = e.tgt.GC(context.Background(), GCOptions{Grace: time.Hour, Now: now.Add(2 * time.Hour)})
	require.NoError(t, err)
	assert.Equal(t, len(packs), rep.PacksDeleted)
	assert.Equal(t, 1, len(e.objects(packsPrefix)), "only v2's pack is left")
	assert.Equal(t, 1, len(e.objects(indexPrefix)))
}
