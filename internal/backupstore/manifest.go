package backupstore

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"
)

// EntryKind says where a chunk's bytes come from on restore.
type EntryKind uint8

const (
	// KindData: a chunk stored in a pack. Chunks without an entry are holes
	// (all zeroes), which are never stored.
	KindData EntryKind = 1
	// KindBacking: the backing image's bytes at the chunk's range,
	// untouched by the volume and never uploaded.
	KindBacking EntryKind = 2
)

// Entry is one non-hole chunk of a backup.
type Entry struct {
	Index  int64 // chunk number: the chunk covers [Index*ChunkSize, +ChunkSize)
	Kind   EntryKind
	Chunk  ChunkID
	Pack   uint32 // ordinal into Manifest.Packs
	Offset uint64 // in the pack
	CLen   uint32 // stored length
	Codec  Codec
}

// BackingImage identifies the image a volume was created from; restore
// needs it to fill KindBacking chunks.
type BackingImage struct {
	Name     string `json:"name"`
	URL      string `json:"url,omitempty"`
	Checksum string `json:"checksum,omitempty"`
}

// Stats are what a backup wrote and references, for the Backup CR's status.
type Stats struct {
	DataChunks    int64 `json:"dataChunks"`    // chunks with data, stored in packs
	BackingChunks int64 `json:"backingChunks"` // chunks left to the backing image
	ReadChunks    int64 `json:"readChunks"`    // chunks read from the snapshot
	NewChunks     int64 `json:"newChunks"`     // chunks this backup uploaded
	NewBytes      int64 `json:"newBytes"`      // stored bytes this backup uploaded
	NewPacks      int64 `json:"newPacks"`      // packs this backup uploaded
	StoredBytes   int64 `json:"storedBytes"`   // stored bytes of every referenced chunk
}

// Header is the readable part of a manifest; ListBackups reads only this.
type Header struct {
	Format       int               `json:"format"`
	Volume       string            `json:"volume"`
	Backup       string            `json:"backup"`
	Snapshot     string            `json:"snapshot"`
	Created      time.Time         `json:"created"`
	VolumeSize   int64             `json:"volumeSize"`
	ChunkSize    int64             `json:"chunkSize"`
	Labels       map[string]string `json:"labels,omitempty"`
	BackingImage *BackingImage     `json:"backingImage,omitempty"`
	// Base is the backup this one is incremental on (BackupInput.Base);
	// empty for a full backup, and in manifests written before it existed.
	Base  string `json:"base,omitempty"`
	Stats Stats  `json:"stats"`
}

// Chunks is the number of chunks of the volume, the last one possibly short.
func (h *Header) Chunks() int64 { return (h.VolumeSize + h.ChunkSize - 1) / h.ChunkSize }

// chunkLen is the length of chunk i (the last may be shorter).
func (h *Header) chunkLen(i int64) int64 { return min(h.ChunkSize, h.VolumeSize-i*h.ChunkSize) }

// Manifest is a complete backup: header, the packs it references and an
// entry per non-hole chunk, sorted by Index.
type Manifest struct {
	Header
	Packs   []PackID
	Entries []Entry
}

// A manifest object is
//
//	"STRMANI1" | len(header) u32 | header JSON | len(table) u32 | zstd(table) | sha256(all before)
//
// and the table is uvarint packs, packs×32 bytes, uvarint entries, then per
// entry uvarint (index - previous index - 1), kind u8 and for data: id[32],
// uvarint pack, uvarint offset, uvarint clen, codec u8. Chunk ids dominate:
// ~40 bytes per data chunk, ~40 MiB for a fully written 1 TiB volume at 1
// MiB chunks, against ~50 MiB for Longhorn's per-block JSON at 2 MiB.
var manifestMagic = []byte("STRMANI1")

const maxHeaderLen = 1 << 20

// Marshal encodes the manifest.
func (m *Manifest) Marshal() ([]byte, error) {
	hdr, err := json.Marshal(&m.Header)
	if err != nil {
		return nil, err
	}
	table := m.encodeTable()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20))
	if err != nil {
		return nil, err
	}
	ztable := enc.EncodeAll(table, nil)
	out := make([]byte, 0, 16+len(hdr)+len(ztable)+sha256.Size)
	out = append(out, manifestMagic...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(hdr)))
	out = append(out, hdr...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(ztable)))
	out = append(out, ztable...)
	sum := sha256.Sum256(out)
	return append(out, sum[:]...), nil
}

func (m *Manifest) encodeTable() []byte {
	var b bytes.Buffer
	b.Grow(len(m.Packs)*32 + len(m.Entries)*48)
	var tmp [binary.MaxVarintLen64]byte
	uv := func(v uint64) { b.Write(tmp[:binary.PutUvarint(tmp[:], v)]) }
	uv(uint64(len(m.Packs)))
	for _, p := range m.Packs {
		b.Write(p[:])
	}
	uv(uint64(len(m.Entries)))
	prev := int64(-1)
	for _, e := range m.Entries {
		uv(uint64(e.Index - prev - 1))
		prev = e.Index
		b.WriteByte(byte(e.Kind))
		if e.Kind == KindData {
			b.Write(e.Chunk[:])
			uv(uint64(e.Pack))
			uv(e.Offset)
			uv(uint64(e.CLen))
			b.WriteByte(byte(e.Codec))
		}
	}
	return b.Bytes()
}

// ErrCorruptManifest wraps every parse failure.
var ErrCorruptManifest = errors.New("corrupt manifest")

func corrupt(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrCorruptManifest, fmt.Sprintf(format, a...))
}

// ParseManifest decodes and checks a whole manifest object.
func ParseManifest(data []byte) (*Manifest, error) {
	if len(data) < len(manifestMagic)+8+sha256.Size {
		return nil, corrupt("%d bytes is too short", len(data))
	}
	body := data[:len(data)-sha256.Size]
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], data[len(body):]) {
		return nil, corrupt("checksum mismatch (truncated or damaged)")
	}
	return parseManifestBody(body)
}

func parseManifestBody(body []byte) (*Manifest, error) {
	h, n, err := parseHeaderPrefix(body)
	if err != nil {
		return nil, err
	}
	rest := body[n:]
	if len(rest) < 4 {
		return nil, corrupt("chunk table length missing")
	}
	tlen := binary.LittleEndian.Uint32(rest)
	if uint64(len(rest)-4) != uint64(tlen) {
		return nil, corrupt("chunk table is %d bytes, header says %d", len(rest)-4, tlen)
	}
	m := &Manifest{Header: *h}
	if err := m.decodeTable(rest[4:]); err != nil {
		return nil, err
	}
	return m, nil
}

// ParseHeader decodes the header from the start of a manifest object (a
// ranged GET of its first bytes suffices). It returns io.ErrUnexpectedEOF
// when prefix is too short to hold the header, and the bytes it needs.
func ParseHeader(prefix []byte) (*Header, int, error) {
	return parseHeaderPrefix(prefix)
}

func parseHeaderPrefix(b []byte) (*Header, int, error) {
	if len(b) < len(manifestMagic)+4 {
		return nil, len(manifestMagic) + 4, io.ErrUnexpectedEOF
	}
	if !bytes.Equal(b[:len(manifestMagic)], manifestMagic) {
		return nil, 0, corrupt("bad magic %q", b[:len(manifestMagic)])
	}
	hlen := binary.LittleEndian.Uint32(b[len(manifestMagic):])
	if hlen > maxHeaderLen {
		return nil, 0, corrupt("header length %d exceeds %d", hlen, maxHeaderLen)
	}
	end := len(manifestMagic) + 4 + int(hlen)
	if len(b) < end {
		return nil, end, io.ErrUnexpectedEOF
	}
	var h Header
	if err := json.Unmarshal(b[len(manifestMagic)+4:end], &h); err != nil {
		return nil, 0, corrupt("header: %v", err)
	}
	if err := h.validate(); err != nil {
		return nil, 0, corrupt("header: %v", err)
	}
	return &h, end, nil
}

func (h *Header) validate() error {
	if h.Format != FormatVersion {
		return fmt.Errorf("format %d, this build reads %d", h.Format, FormatVersion)
	}
	if err := checkName("volume", h.Volume); err != nil {
		return err
	}
	if err := checkName("backup", h.Backup); err != nil {
		return err
	}
	f := Format{Format: FormatVersion, ChunkSize: h.ChunkSize, PackSize: h.ChunkSize}
	if err := f.validate(); err != nil {
		return err
	}
	if h.VolumeSize <= 0 || h.VolumeSize/h.ChunkSize >= 1<<32 {
		return fmt.Errorf("volumeSize %d out of range", h.VolumeSize)
	}
	return nil
}

// decodeTable streams the table: entries are appended as they parse, so a
// forged count cannot make the parser allocate more than the data holds.
func (m *Manifest) decodeTable(z []byte) error {
	dec, err := zstd.NewReader(bytes.NewReader(z), zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(8<<20))
	if err != nil {
		return corrupt("chunk table: %v", err)
	}
	defer dec.Close()
	r := bufio.NewReader(dec)
	chunks := m.Chunks()
	npacks, err := binary.ReadUvarint(r)
	if err != nil || npacks > uint64(chunks) {
		return corrupt("chunk table: pack count %d (%v)", npacks, err)
	}
	for i := uint64(0); i < npacks; i++ {
		var p PackID
		if _, err := io.ReadFull(r, p[:]); err != nil {
			return corrupt("chunk table: pack %d: %v", i, err)
		}
		m.Packs = append(m.Packs, p)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil || n > uint64(chunks) {
		return corrupt("chunk table: entry count %d (%v)", n, err)
	}
	prev := int64(-1)
	for i := uint64(0); i < n; i++ {
		e, err := m.decodeEntry(r, prev)
		if err != nil {
			return corrupt("chunk table: entry %d: %v", i, err)
		}
		prev = e.Index
		m.Entries = append(m.Entries, e)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		return corrupt("chunk table: trailing data after %d entries (%v)", n, err)
	}
	return nil
}

func (m *Manifest) decodeEntry(r *bufio.Reader, prev int64) (Entry, error) {
	var e Entry
	delta, err := binary.ReadUvarint(r)
	if err != nil {
		return e, err
	}
	if delta >= uint64(m.Chunks()-prev-1) {
		return e, fmt.Errorf("chunk index beyond the volume's %d chunks", m.Chunks())
	}
	e.Index = prev + 1 + int64(delta)
	kind, err := r.ReadByte()
	if err != nil {
		return e, err
	}
	e.Kind = EntryKind(kind)
	switch e.Kind {
	case KindBacking:
		return e, nil
	case KindData:
	default:
		return e, fmt.Errorf("unknown kind %d", kind)
	}
	if _, err := io.ReadFull(r, e.Chunk[:]); err != nil {
		return e, err
	}
	pack, err := binary.ReadUvarint(r)
	if err != nil || pack >= uint64(len(m.Packs)) {
		return e, fmt.Errorf("pack ordinal %d of %d (%v)", pack, len(m.Packs), err)
	}
	e.Pack = uint32(pack)
	if e.Offset, err = binary.ReadUvarint(r); err != nil || e.Offset < uint64(len(packMagic)) || e.Offset > maxPackSize {
		return e, fmt.Errorf("offset %d (%v)", e.Offset, err)
	}
	clen, err := binary.ReadUvarint(r)
	if err != nil || clen == 0 || clen > uint64(m.chunkLen(e.Index)) {
		return e, fmt.Errorf("stored length %d (%v)", clen, err)
	}
	e.CLen = uint32(clen)
	codec, err := r.ReadByte()
	if err != nil || Codec(codec) > CodecZstd {
		return e, fmt.Errorf("codec %d (%v)", codec, err)
	}
	e.Codec = Codec(codec)
	return e, nil
}
