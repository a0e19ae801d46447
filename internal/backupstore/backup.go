package backupstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/strata-storage/strata/types"
)

// BackupInput describes one backup of one snapshot.
type BackupInput struct {
	Volume, Backup, Snapshot string
	Size                     int64       // volume size in bytes
	Source                   io.ReaderAt // the volume's content at Snapshot
	// Changed are the byte ranges the layers since Base's snapshot hold (or,
	// without Base, every layer's allocated ranges). nil means everything.
	// Chunks that intersect no range are not read: they come from Base, or
	// are holes when there is no Base.
	Changed []Range
	Base    *Manifest // the previous backup of this volume, or nil
	// Backing are ranges holding the backing image's untouched bytes; chunks
	// they cover are recorded as KindBacking and never read or uploaded.
	Backing      []Range
	BackingImage *BackingImage
	Labels       map[string]string
	Concurrency  int                     // chunk workers; default 4
	MaxMemory    int64                   // bytes of chunks and packs in flight; default 256 MiB
	Progress     func(done, total int64) // bytes read so far of those to read; called serially
	Now          func() time.Time        // manifest time; default time.Now
}

const (
	defaultConcurrency = 4
	defaultMaxMemory   = 256 << 20
	// markerRefresh is how often a running backup rewrites its inflight
	// marker, so GC's MaxBackupDuration bounds a silent crash, not the
	// length of a backup.
	markerRefresh = 5 * time.Minute
)

func backupExists(in *BackupInput) error {
	return fmt.Errorf("backup %s of volume %s already exists on the target: %w", in.Backup, in.Volume, ErrExists)
}

// Backup writes a backup and returns its manifest. The manifest is the
// last object written, with PutIfAbsent: until it exists the backup does
// not, whatever happened to the packs before a crash.
func (t *Target) Backup(ctx context.Context, in BackupInput) (*Manifest, error) {
	b, err := t.newBackupRun(&in)
	if err != nil {
		return nil, err
	}
	key := manifestKey(in.Volume, in.Backup)
	if _, err := t.store.Stat(ctx, key); err == nil {
		return nil, backupExists(&in)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("backup %s of volume %s: %w", in.Backup, in.Volume, err)
	}
	stop, err := t.startInflight(ctx, &in)
	if err != nil {
		return nil, err
	}
	defer stop()
	m, err := b.run(ctx)
	if err != nil {
		return nil, fmt.Errorf("backup %s of volume %s: %w", in.Backup, in.Volume, err)
	}
	data, err := m.Marshal()
	if err != nil {
		return nil, err
	}
	if err := t.store.PutIfAbsent(ctx, key, data); err != nil {
		if errors.Is(err, ErrExists) {
			return nil, backupExists(&in)
		}
		return nil, fmt.Errorf("backup %s of volume %s: write manifest: %w", in.Backup, in.Volume, err)
	}
	return m, nil
}

// startInflight writes inflight/<volume>/<backup>-<nonce> and refreshes it
// until stop is called; stop deletes it even if ctx was cancelled.
func (t *Target) startInflight(ctx context.Context, in *BackupInput) (func(), error) {
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	key := inflightPfx + in.Volume + "/" + in.Backup + "-" + hex.EncodeToString(nonce)
	body, _ := json.Marshal(map[string]string{"volume": in.Volume, "backup": in.Backup, "snapshot": in.Snapshot})
	put := func(ctx context.Context) error {
		return t.store.Put(ctx, key, bytes.NewReader(body), int64(len(body)))
	}
	if err := put(ctx); err != nil {
		return nil, fmt.Errorf("backup %s of volume %s: write %s: %w", in.Backup, in.Volume, key, err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(markerRefresh)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if err := put(ctx); err != nil {
					t.log.WithError(err).WithField("key", key).Warn("Failed to refresh inflight marker")
				}
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := t.store.Delete(dctx, key); err != nil {
			t.log.WithError(err).WithField("key", key).Warn("Failed to delete inflight marker; GC will ignore it once stale")
		}
	}, nil
}

// slot is the state of one chunk during a backup; kind 0 is a hole.
type slot struct {
	kind EntryKind
	id   ChunkID
}

// uploadedChunk is where this run stored a chunk.
type uploadedChunk struct {
	pack PackID
	e    packEntry
}

type backupRun struct {
	t         *Target
	in        *BackupInput
	hdr       Header
	changed   rangeSet
	backing   rangeSet
	workers   int
	uploaders int
	readBufs  *bufferList // chunk-sized; upload's
	slots     []slot

	mu       sync.Mutex
	claimed  map[ChunkID]bool          // queued for upload by this run
	uploaded map[ChunkID]uploadedChunk // stored by this run
	ourPacks map[PackID]bool
	stats    Stats
	done     int64
	total    int64
}

func (t *Target) newBackupRun(in *BackupInput) (*backupRun, error) {
	if err := t.checkInput(in); err != nil {
		return nil, err
	}
	now := time.Now
	if in.Now != nil {
		now = in.Now
	}
	b := &backupRun{
		t: t, in: in,
		hdr: Header{
			Format: FormatVersion, Volume: in.Volume, Backup: in.Backup, Snapshot: in.Snapshot,
			Created: now().UTC(), VolumeSize: in.Size, ChunkSize: t.format.ChunkSize,
			Labels: in.Labels, BackingImage: in.BackingImage,
		},
		backing: newRangeSet(in.Backing), workers: in.Concurrency,
		claimed: map[ChunkID]bool{}, uploaded: map[ChunkID]uploadedChunk{}, ourPacks: map[PackID]bool{},
	}
	if in.Base != nil {
		b.hdr.Base = in.Base.Backup
	}
	if in.Changed != nil {
		b.changed = newRangeSet(in.Changed)
	}
	b.slots = make([]slot, b.hdr.Chunks())
	// Memory: uploaders packs uploading + one sealed waiting, and per worker
	// a read buffer, a compressed copy and a queued blob.
	cs, ps := t.format.ChunkSize, t.format.PackSize+t.format.ChunkSize
	room := in.MaxMemory - int64(3*b.workers)*cs
	b.uploaders = min(int(room/ps)-1, b.workers)
	if b.uploaders < 1 {
		return nil, fmt.Errorf("maxMemory %d: below the %d bytes %d workers and two packs need",
			in.MaxMemory, 2*ps+int64(3*b.workers)*cs, b.workers)
	}
	return b, nil
}

func (t *Target) checkInput(in *BackupInput) error {
	for _, c := range []struct{ field, v string }{{"volume", in.Volume}, {"backup", in.Backup}} {
		if err := checkName(c.field, c.v); err != nil {
			return err
		}
	}
	// The snapshot's name is no key segment (only the manifest records
	// it): the data plane's own rule, which allows what the replicas do.
	if err := types.ValidateSnapshotName(in.Snapshot); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	switch {
	case in.Size <= 0 || in.Size/t.format.ChunkSize >= 1<<32:
		return fmt.Errorf("size %d: out of range", in.Size)
	case in.Source == nil:
		return errors.New("source: required")
	case in.Base != nil && in.Base.ChunkSize != t.format.ChunkSize:
		return fmt.Errorf("base: backup %s has chunk size %d, the target %d", in.Base.Backup, in.Base.ChunkSize, t.format.ChunkSize)
	case len(in.Backing) > 0 && (in.BackingImage == nil || in.BackingImage.Name == ""):
		return errors.New("backingImage: required when backing ranges are given")
	}
	if in.Concurrency <= 0 {
		in.Concurrency = defaultConcurrency
	}
	in.Concurrency = min(in.Concurrency, 64)
	if in.MaxMemory <= 0 {
		in.MaxMemory = defaultMaxMemory
	}
	return nil
}

// run plans, uploads and assembles the manifest. Packs it references but
// did not upload are checked to exist (a GC may have removed one since the
// index was read); the chunks of a missing pack are read and uploaded again.
func (b *backupRun) run(ctx context.Context) (*Manifest, error) {
	if err := b.t.syncIndex(ctx); err != nil {
		return nil, err
	}
	toRead := b.plan()
	b.total = int64(len(toRead)) * b.hdr.ChunkSize
	b.stats.ReadChunks = int64(len(toRead))
	for attempt := 0; ; attempt++ {
		if err := b.upload(ctx, toRead); err != nil {
			return nil, err
		}
		m, redo := b.assemble()
		missing, err := b.missingPacks(ctx, m)
		if err != nil {
			return nil, err
		}
		redo = append(redo, b.chunksIn(m, missing)...)
		if len(redo) == 0 {
			return m, nil
		}
		if attempt == 2 {
			return nil, fmt.Errorf("%d chunks still in missing packs after %d attempts (is a GC deleting live packs?)", len(redo), attempt+1)
		}
		b.t.log.WithField("chunks", len(redo)).Warn("Packs vanished during backup; uploading their chunks again")
		b.t.index.drop(missing)
		toRead = redo
		b.stats.ReadChunks += int64(len(redo))
	}
}

// plan fills the slots of chunks that are not read (backing, base, holes)
// and returns the chunks to read, in order.
func (b *backupRun) plan() []int64 {
	var toRead []int64
	var base []Entry
	if b.in.Base != nil {
		base = b.in.Base.Entries
	}
	for i := range int64(len(b.slots)) {
		off, n := i*b.hdr.ChunkSize, b.hdr.chunkLen(i)
		touched := b.changed == nil || b.changed.intersects(off, n)
		if b.backing.covers(off, n) && (b.in.Changed == nil || !touched) {
			b.slots[i] = slot{kind: KindBacking}
			continue
		}
		if touched {
			toRead = append(toRead, i)
			continue
		}
		for len(base) > 0 && base[0].Index < i {
			base = base[1:]
		}
		if len(base) == 0 || base[0].Index != i {
			continue // a hole in the base, or beyond it: still a hole
		}
		switch e := base[0]; {
		case e.Kind == KindBacking:
			b.slots[i] = slot{kind: KindBacking}
		case b.t.index.has(e.Chunk):
			b.slots[i] = slot{kind: KindData, id: e.Chunk}
		default:
			toRead = append(toRead, i) // its pack is no longer indexed
		}
	}
	return toRead
}

func (b *backupRun) progress(n int64) {
	if b.in.Progress == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done += n
	b.in.Progress(b.done, b.total)
}

// claim reports whether this worker should upload id: the first to see a
// chunk not yet in the target's index does.
func (b *backupRun) claim(id ChunkID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.claimed[id] {
		return false
	}
	b.claimed[id] = true
	return true
}

func (b *backupRun) locate(id ChunkID) (PackID, packEntry, bool) {
	b.mu.Lock()
	u, ok := b.uploaded[id]
	b.mu.Unlock()
	if ok {
		return u.pack, u.e, true
	}
	p, loc, ok := b.t.index.lookup(id)
	return p, packEntry{ID: id, Offset: loc.offset, CLen: loc.clen, Codec: loc.codec}, ok
}

// assemble builds the manifest from the slots; chunks it cannot locate
// (their pack dropped from the index meanwhile) are returned to redo.
func (b *backupRun) assemble() (*Manifest, []int64) {
	m := &Manifest{Header: b.hdr}
	ord := map[PackID]uint32{}
	var redo []int64
	st := b.stats
	st.DataChunks, st.BackingChunks, st.StoredBytes = 0, 0, 0
	for i, s := range b.slots {
		switch s.kind {
		case KindBacking:
			m.Entries = append(m.Entries, Entry{Index: int64(i), Kind: KindBacking})
			st.BackingChunks++
		case KindData:
			pack, e, ok := b.locate(s.id)
			if !ok {
				redo = append(redo, int64(i))
				continue
			}
			o, seen := ord[pack]
			if !seen {
				o = uint32(len(m.Packs))
				ord[pack] = o
				m.Packs = append(m.Packs, pack)
			}
			m.Entries = append(m.Entries, Entry{
				Index: int64(i), Kind: KindData, Chunk: s.id, Pack: o, Offset: e.Offset, CLen: e.CLen, Codec: e.Codec,
			})
			st.DataChunks++
			st.StoredBytes += int64(e.CLen)
		}
	}
	m.Stats = st
	return m, redo
}

// missingPacks checks the packs m references that this run did not upload:
// a Stat each when few, else one List of packs/ with a Stat for each pack
// the listing lacks, so an incomplete listing costs requests, not data.
func (b *backupRun) missingPacks(ctx context.Context, m *Manifest) (map[PackID]bool, error) {
	var check []PackID
	for _, p := range m.Packs {
		if !b.ourPacks[p] {
			check = append(check, p)
		}
	}
	listed := map[string]bool{}
	if len(check) > 64 {
		objs, err := b.t.store.List(ctx, packsPrefix)
		if err != nil {
			return nil, fmt.Errorf("list packs: %w", err)
		}
		for _, o := range objs {
			listed[o.Key] = true
		}
	}
	missing := map[PackID]bool{}
	for _, p := range check {
		if listed[packKey(p)] {
			continue
		}
		_, err := b.t.store.Stat(ctx, packKey(p))
		if errors.Is(err, ErrNotFound) {
			missing[p] = true
		} else if err != nil {
			return nil, fmt.Errorf("check pack %s: %w", p, err)
		}
	}
	return missing, nil
}

func (b *backupRun) chunksIn(m *Manifest, packs map[PackID]bool) []int64 {
	var out []int64
	for _, e := range m.Entries {
		if e.Kind == KindData && packs[m.Packs[e.Pack]] {
			out = append(out, e.Index)
		}
	}
	return out
}
