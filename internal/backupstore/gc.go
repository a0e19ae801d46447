package backupstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

const maxManifestSize = 1 << 30

// LoadManifest reads and checks the manifest of one backup.
func (t *Target) LoadManifest(ctx context.Context, volume, backup string) (*Manifest, error) {
	if err := checkName("volume", volume); err != nil {
		return nil, err
	}
	if err := checkName("backup", backup); err != nil {
		return nil, err
	}
	return t.loadManifestKey(ctx, manifestKey(volume, backup))
}

func (t *Target) loadManifestKey(ctx context.Context, key string) (*Manifest, error) {
	data, err := readAll(ctx, t.store, key, maxManifestSize)
	if err != nil {
		return nil, err
	}
	m, err := ParseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return m, nil
}

// DeleteBackup deletes a backup's manifest. Its chunks stay until a GC
// finds no other manifest referencing their packs.
func (t *Target) DeleteBackup(ctx context.Context, volume, backup string) error {
	if err := checkName("volume", volume); err != nil {
		return err
	}
	if err := checkName("backup", backup); err != nil {
		return err
	}
	return t.store.Delete(ctx, manifestKey(volume, backup))
}

// HasBackup tells whether a backup's manifest is on the target now: a
// listing taken a moment ago may name one deleted since.
func (t *Target) HasBackup(ctx context.Context, volume, backup string) (bool, error) {
	if err := checkName("volume", volume); err != nil {
		return false, err
	}
	if err := checkName("backup", backup); err != nil {
		return false, err
	}
	_, err := t.store.Stat(ctx, manifestKey(volume, backup))
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// VolumeHasBackups tells whether the target holds a backup of volume now,
// with one List of that volume's manifests: a whole listing that lacks the
// volume may be a short one (an NFS hiccup), and a caller about to act on
// its absence asks again.
func (t *Target) VolumeHasBackups(ctx context.Context, volume string) (bool, error) {
	if err := checkName("volume", volume); err != nil {
		return false, err
	}
	objs, err := t.store.List(ctx, backupsPrefix+volume+"/")
	if err != nil {
		return false, fmt.Errorf("list backups of volume %s: %w", volume, err)
	}
	return len(manifestObjects(objs)) > 0, nil
}

// BackupInfo is one listed backup.
type BackupInfo struct {
	Header
	Key  string
	Size int64 // of the manifest object
}

const headerProbe = 16 << 10

// ListBackups lists every backup on the target (one List of backups/, then
// one ranged GET of each manifest's head), sorted by volume and time, so a
// new cluster can find what an old one left.
func (t *Target) ListBackups(ctx context.Context) ([]BackupInfo, error) {
	objs, err := t.store.List(ctx, backupsPrefix)
	if err != nil {
		return nil, fmt.Errorf("list backups: %w", err)
	}
	objs = manifestObjects(objs)
	out := make([]BackupInfo, len(objs))
	err = parallel(ctx, len(objs), 8, func(i int) error {
		h, err := t.readHeader(ctx, objs[i])
		if err != nil {
			return err
		}
		out[i] = BackupInfo{Header: *h, Key: objs[i].Key, Size: objs[i].Size}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Volume != out[j].Volume {
			return out[i].Volume < out[j].Volume
		}
		return out[i].Created.Before(out[j].Created)
	})
	return out, nil
}

func manifestObjects(objs []ObjectInfo) []ObjectInfo {
	var out []ObjectInfo
	for _, o := range objs {
		if strings.HasSuffix(o.Key, manifestExt) {
			out = append(out, o)
		}
	}
	return out
}

func (t *Target) readHeader(ctx context.Context, o ObjectInfo) (*Header, error) {
	n := min(int64(headerProbe), o.Size)
	for {
		rc, err := t.store.GetRange(ctx, o.Key, 0, n)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", o.Key, err)
		}
		buf, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", o.Key, err)
		}
		h, need, err := ParseHeader(buf)
		if errors.Is(err, io.ErrUnexpectedEOF) && int64(need) > n && int64(need) <= o.Size {
			n = int64(need)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.Key, err)
		}
		if want := manifestKey(h.Volume, h.Backup); want != o.Key {
			return nil, fmt.Errorf("%s: header names %s", o.Key, want)
		}
		return h, nil
	}
}

// GCOptions tune GC.
type GCOptions struct {
	// Grace: an unreferenced pack younger than this is kept (it may belong
	// to a backup whose manifest is not written yet). Default 24h.
	Grace time.Duration
	// MaxBackupDuration: an inflight marker not refreshed for this long is
	// a crashed backup's and is ignored and deleted. Default 1h (running
	// backups refresh theirs every 5 minutes).
	MaxBackupDuration time.Duration
	Now               time.Time // default time.Now()
	// ConfirmEmpty lets GC sweep when no manifest is listed at all. Set it
	// only when another source (the cluster's Backup objects) agrees the
	// target holds no backups: an empty listing alone is never trusted.
	ConfirmEmpty bool
	DryRun       bool
}

// GCReport says what GC saw and did.
type GCReport struct {
	Manifests       int
	Packs           int
	PacksReferenced int
	PacksYoung      int // unreferenced, within Grace
	PacksDeleted    int
	BytesDeleted    int64
	BytesKept       int64
	IndexesDeleted  int      // index objects of deleted packs and orphans
	MarkersDeleted  int      // stale inflight markers
	MissingPacks    []string // referenced by a manifest but absent: "pack (backup)"
	Deferred        string   // why nothing was swept, if so
}

// GC is mark and sweep: every pack a listed manifest references is kept;
// an unreferenced pack older than Grace is deleted, index object first.
// It sweeps nothing while a fresh inflight marker exists, when the marker
// object is missing (an unmounted or wrong target), when any manifest
// cannot be read, or when no manifest is listed while packs exist.
func (t *Target) GC(ctx context.Context, opts GCOptions) (*GCReport, error) {
	opts = gcDefaults(opts)
	if _, err := readFormat(ctx, t.store); err != nil {
		return nil, fmt.Errorf("gc: refusing to collect without the target's %s (unmounted or wrong target?): %w", markerKey, err)
	}
	rep := &GCReport{}
	packs, err := t.store.List(ctx, packsPrefix)
	if err != nil {
		return nil, fmt.Errorf("gc: list packs: %w", err)
	}
	rep.Packs = len(packs)
	live, err := t.mark(ctx, rep)
	if err != nil {
		return rep, err
	}
	if rep.Manifests == 0 && len(packs) > 0 && !opts.ConfirmEmpty {
		return rep, fmt.Errorf("gc: no manifest listed under %s but %d packs exist: refusing to delete anything on an empty listing", backupsPrefix, len(packs))
	}
	if reason, err := t.inflight(ctx, opts, rep); err != nil || reason != "" {
		rep.Deferred = reason
		return rep, err
	}
	listed := map[string]bool{}
	for _, p := range packs {
		listed[p.Key] = true
	}
	for k, b := range live {
		if !listed[k] {
			rep.MissingPacks = append(rep.MissingPacks, k+" ("+b+")")
		}
	}
	sort.Strings(rep.MissingPacks)
	doomed := sweepSet(packs, live, opts, rep)
	if opts.DryRun {
		return rep, nil
	}
	return rep, t.sweep(ctx, opts, doomed, packs, rep)
}

func gcDefaults(o GCOptions) GCOptions {
	if o.Grace <= 0 {
		o.Grace = 24 * time.Hour
	}
	if o.MaxBackupDuration <= 0 {
		o.MaxBackupDuration = time.Hour
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	return o
}

// mark reads every manifest; any unreadable one aborts the GC, because
// its packs would otherwise look unreferenced.
func (t *Target) mark(ctx context.Context, rep *GCReport) (map[string]string, error) {
	objs, err := t.store.List(ctx, backupsPrefix)
	if err != nil {
		return nil, fmt.Errorf("gc: list backups: %w", err)
	}
	objs = manifestObjects(objs)
	rep.Manifests = len(objs)
	live := map[string]string{}
	for _, o := range objs {
		m, err := t.loadManifestKey(ctx, o.Key)
		if err != nil {
			return nil, fmt.Errorf("gc: mark: %w (nothing deleted)", err)
		}
		for _, p := range m.Packs {
			live[packKey(p)] = m.Volume + "/" + m.Backup
		}
	}
	rep.PacksReferenced = len(live)
	return live, nil
}

// inflight returns why GC must not sweep now: a backup has refreshed its
// marker within MaxBackupDuration. Stale markers are deleted.
func (t *Target) inflight(ctx context.Context, opts GCOptions, rep *GCReport) (string, error) {
	objs, err := t.store.List(ctx, inflightPfx)
	if err != nil {
		return "", fmt.Errorf("gc: list inflight: %w", err)
	}
	reason := ""
	for _, o := range objs {
		if age := opts.Now.Sub(o.ModTime); age < opts.MaxBackupDuration {
			if reason == "" {
				reason = fmt.Sprintf("backup in flight (%s, refreshed %s ago)", strings.TrimPrefix(o.Key, inflightPfx), age.Round(time.Second))
			}
			continue
		}
		if !opts.DryRun {
			if err := t.store.Delete(ctx, o.Key); err != nil {
				return "", fmt.Errorf("gc: delete stale %s: %w", o.Key, err)
			}
			rep.MarkersDeleted++
		}
	}
	return reason, nil
}

func sweepSet(packs []ObjectInfo, live map[string]string, opts GCOptions, rep *GCReport) []ObjectInfo {
	var doomed []ObjectInfo
	for _, p := range packs {
		switch {
		case live[p.Key] != "":
			rep.BytesKept += p.Size
		case opts.Now.Sub(p.ModTime) < opts.Grace:
			rep.PacksYoung++
			rep.BytesKept += p.Size
		default:
			doomed = append(doomed, p)
		}
	}
	return doomed
}

// sweep deletes the index objects of doomed packs first: from then on no
// backup that syncs its index can dedupe onto them. It then checks the
// inflight markers again — a backup that started before the index objects
// went may hold them in its cache — and only then deletes the packs. A
// pack whose index object is gone is an orphan the next GC deletes.
func (t *Target) sweep(ctx context.Context, opts GCOptions, doomed, packs []ObjectInfo, rep *GCReport) error {
	for _, p := range doomed {
		if err := t.store.Delete(ctx, indexPrefix+p.Key[strings.LastIndexByte(p.Key, '/')+1:]); err != nil {
			return fmt.Errorf("gc: delete index of %s: %w", p.Key, err)
		}
		rep.IndexesDeleted++
	}
	if err := t.deleteOrphanIndexes(ctx, opts, packs, rep); err != nil {
		return err
	}
	if reason, err := t.inflight(ctx, opts, rep); err != nil || reason != "" {
		rep.Deferred = reason + "; index objects deleted, packs left for the next GC"
		return err
	}
	for _, p := range doomed {
		if err := t.store.Delete(ctx, p.Key); err != nil {
			return fmt.Errorf("gc: delete %s: %w", p.Key, err)
		}
		rep.PacksDeleted++
		rep.BytesDeleted += p.Size
	}
	return nil
}

// deleteOrphanIndexes removes index objects older than Grace whose pack
// was not listed: they can only make a backup dedupe onto nothing.
func (t *Target) deleteOrphanIndexes(ctx context.Context, opts GCOptions, packs []ObjectInfo, rep *GCReport) error {
	idx, err := t.store.List(ctx, indexPrefix)
	if err != nil {
		return fmt.Errorf("gc: list index: %w", err)
	}
	have := map[string]bool{}
	for _, p := range packs {
		have[p.Key[strings.LastIndexByte(p.Key, '/')+1:]] = true
	}
	for _, o := range idx {
		name := strings.TrimPrefix(o.Key, indexPrefix)
		if have[name] || opts.Now.Sub(o.ModTime) < opts.Grace {
			continue
		}
		if err := t.store.Delete(ctx, o.Key); err != nil {
			return fmt.Errorf("gc: delete orphan %s: %w", o.Key, err)
		}
		rep.IndexesDeleted++
	}
	return nil
}
