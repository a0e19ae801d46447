package backupstore

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FormatVersion is the version written into the marker and every manifest.
const FormatVersion = 1

// Defaults; the figures behind them are in docs/backupstore.md.
const (
	DefaultChunkSize = 1 << 20  // 1 MiB
	DefaultPackSize  = 32 << 20 // 32 MiB compressed
	minChunkSize     = 64 << 10
	maxChunkSize     = 16 << 20
	maxPackSize      = 1 << 30
)

// Object layout under the target (docs/backupstore.md says why).
const (
	markerKey     = "strata-backupstore.json"
	packsPrefix   = "packs/"
	indexPrefix   = "index/"
	backupsPrefix = "backups/"
	inflightPfx   = "inflight/"
	manifestExt   = ".manifest"
)

// ChunkID is the SHA-256 of a chunk's uncompressed bytes.
type ChunkID [32]byte

func (id ChunkID) String() string { return hex.EncodeToString(id[:]) }

// PackID is the SHA-256 of a whole pack object.
type PackID [32]byte

func (id PackID) String() string { return hex.EncodeToString(id[:]) }

func parsePackID(s string) (PackID, error) {
	var id PackID
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(id) {
		return id, fmt.Errorf("invalid pack id %q", s)
	}
	copy(id[:], b)
	return id, nil
}

func packKey(id PackID) string {
	h := id.String()
	return packsPrefix + h[:2] + "/" + h
}

func indexKey(id PackID) string { return indexPrefix + id.String() }

func manifestKey(volume, backup string) string {
	return backupsPrefix + volume + "/" + backup + manifestExt
}

// checkName: volume and backup names are Kubernetes object names (DNS-1123
// subdomains, as the API server checks them): they become key segments, so
// '/', '..' and leading dots are impossible by construction.
func checkName(field, name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%s %q: %s", field, name, strings.Join(errs, "; "))
	}
	return nil
}

// Format is the content of the marker object: parameters fixed for the life
// of the target, because chunk ids only dedupe across equal chunk sizes.
type Format struct {
	Format    int   `json:"format"`
	ChunkSize int64 `json:"chunkSize"`
	PackSize  int64 `json:"packSize"`
}

func (f Format) validate() error {
	if f.Format != FormatVersion {
		return fmt.Errorf("format %d: this build reads format %d", f.Format, FormatVersion)
	}
	if f.ChunkSize < minChunkSize || f.ChunkSize > maxChunkSize || f.ChunkSize&(f.ChunkSize-1) != 0 {
		return fmt.Errorf("chunkSize %d: must be a power of two from %d to %d", f.ChunkSize, minChunkSize, maxChunkSize)
	}
	if f.PackSize < f.ChunkSize || f.PackSize > maxPackSize {
		return fmt.Errorf("packSize %d: must be from chunkSize (%d) to %d", f.PackSize, f.ChunkSize, maxPackSize)
	}
	return nil
}

// Options configure Open. ChunkSize and PackSize apply only when Open
// creates the marker; an existing target keeps its own.
type Options struct {
	ChunkSize int64
	PackSize  int64
	Logger    logrus.FieldLogger // nil: no logging
}

// Target is an opened backup target: its format and a cache of the chunk
// index, shared by every backup run through it.
type Target struct {
	store  ObjectStore
	format Format
	log    logrus.FieldLogger
	index  *chunkIndex
	enc    *zstd.Encoder
	dec    *zstd.Decoder
	zero   []byte
}

// Open reads the target's marker, creating it (PutIfAbsent, so two
// clusters formatting one target agree) when the target is new.
func Open(ctx context.Context, store ObjectStore, opts Options) (*Target, error) {
	f, err := loadOrCreateFormat(ctx, store, opts)
	if err != nil {
		return nil, err
	}
	// EncodeAll takes one of the encoder's concurrency states per call:
	// with one, the backup's chunk workers would compress one at a time.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecodeAllCapLimit(true), zstd.WithDecoderConcurrency(0))
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = l
	}
	return &Target{
		store: store, format: f, log: log, index: newChunkIndex(),
		enc: enc, dec: dec, zero: make([]byte, f.ChunkSize),
	}, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Format returns the target's fixed parameters.
func (t *Target) Format() Format { return t.format }

// Store returns the object store the target lives on.
func (t *Target) Store() ObjectStore { return t.store }

func loadOrCreateFormat(ctx context.Context, store ObjectStore, opts Options) (Format, error) {
	want := Format{Format: FormatVersion, ChunkSize: opts.ChunkSize, PackSize: opts.PackSize}
	if want.ChunkSize == 0 {
		want.ChunkSize = DefaultChunkSize
	}
	if want.PackSize == 0 {
		want.PackSize = DefaultPackSize
	}
	if err := want.validate(); err != nil {
		return Format{}, fmt.Errorf("backup target options: %w", err)
	}
	f, err := readFormat(ctx, store)
	if errors.Is(err, ErrNotFound) {
		data, _ := json.Marshal(want)
		err = store.PutIfAbsent(ctx, markerKey, data)
		if err == nil {
			return want, nil
		}
		if !errors.Is(err, ErrExists) {
			return Format{}, fmt.Errorf("create %s: %w", markerKey, err)
		}
		f, err = readFormat(ctx, store) // another writer formatted it first
	}
	if err != nil {
		return Format{}, err
	}
	if opts.ChunkSize != 0 && opts.ChunkSize != f.ChunkSize {
		return Format{}, fmt.Errorf("backup target has chunkSize %d, not %d: chunk size is fixed when a target is created", f.ChunkSize, opts.ChunkSize)
	}
	return f, nil
}

func readFormat(ctx context.Context, store ObjectStore) (Format, error) {
	data, err := readAll(ctx, store, markerKey, 64<<10)
	if err != nil {
		return Format{}, err
	}
	var f Format
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&f); err != nil {
		return Format{}, fmt.Errorf("%s: %w", markerKey, err)
	}
	if err := f.validate(); err != nil {
		return Format{}, fmt.Errorf("%s: %w", markerKey, err)
	}
	return f, nil
}

// Range is a byte range of a volume.
type Range struct {
	Offset, Length int64
}

// rangeSet answers "does chunk [off, off+n) intersect / lie within" for a
// list of ranges, sorted and merged once.
type rangeSet []Range

func newRangeSet(rs []Range) rangeSet {
	out := make(rangeSet, 0, len(rs))
	for _, r := range rs {
		if r.Length > 0 {
			out = append(out, r)
		}
	}
	sortRanges(out)
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && r.Offset <= merged[n-1].Offset+merged[n-1].Length {
			end := max(merged[n-1].Offset+merged[n-1].Length, r.Offset+r.Length)
			merged[n-1].Length = end - merged[n-1].Offset
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// find returns the first range ending after off.
func (s rangeSet) find(off int64) int {
	lo, hi := 0, len(s)
	for lo < hi {
		m := (lo + hi) / 2
		if s[m].Offset+s[m].Length <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

func (s rangeSet) intersects(off, n int64) bool {
	i := s.find(off)
	return i < len(s) && s[i].Offset < off+n
}

func (s rangeSet) covers(off, n int64) bool {
	i := s.find(off)
	return i < len(s) && s[i].Offset <= off && s[i].Offset+s[i].Length >= off+n
}

func sortRanges(rs []Range) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
}
