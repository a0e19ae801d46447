package replica

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/types"
)

// MetaFile is the file that makes a directory a replica: others (the
// instance manager) test for it before opening or deleting one.
const MetaFile = volumeMetaFile

// File names inside a replica directory.
const (
	volumeMetaFile = "volume.meta"
	metaSuffix     = ".meta"
	imgSuffix      = ".img"
	headPrefix     = "volume-head-"
	snapPrefix     = "volume-snap-"
	// Temporary files start with a dot and end in tmpSuffix; no layer file
	// can look like that, so Open may delete them without doubt.
	tmpSuffix = ".tmp"

	// formatVersion is bumped on any incompatible change of the files.
	// 2: zero marks (zeromarks.go), which a build of version 1 would read
	// through, showing older data; such a build refuses version 2. Open
	// upgrades a replica of version oldestFormatVersion or later (a
	// version-1 replica has no marks) by rewriting volume.meta.
	formatVersion       = 2
	oldestFormatVersion = 1

	// HeadName is how the live writable layer is named in Chain() and in
	// Extents/ReadLayer, and the name field of the head's .meta. The name is
	// shared with the control plane, so it is defined in types.
	HeadName = types.VolumeHeadName

	// BackingName is how the backing file is named in Extents/ReadLayer, so
	// export, clone and rebuild can read it like a layer. No snapshot can
	// take it: snapshot names start with a letter or digit.
	BackingName = "@backing"

	// maxHeadIndex keeps head file names short and the counter far from
	// overflow; a head is replaced once per snapshot or revert.
	maxHeadIndex = 1<<31 - 1

	// maxMetaBytes bounds what Open reads from a .meta file, so a damaged
	// file cannot make it allocate without limit.
	maxMetaBytes = 1 << 20
)

func headFileName(index int) string   { return fmt.Sprintf("%s%03d%s", headPrefix, index, imgSuffix) }
func snapFileName(name string) string { return snapPrefix + name + imgSuffix }
func tmpName(name string) string      { return "." + name + tmpSuffix }

// volumeMeta is volume.meta: the root of the chain. Replacing it is the
// commit point of every structural change.
type volumeMeta struct {
	FormatVersion int    `json:"formatVersion"`
	Size          int64  `json:"size"`
	Head          string `json:"head"`
	HeadIndex     int    `json:"headIndex"`
	BackingFile   string `json:"backingFile,omitempty"`
	// Snapshots lists every snapshot layer of the replica (any branch).
	// Layer files not listed are leftovers of an interrupted operation.
	Snapshots []string `json:"snapshots"`
}

func (m *volumeMeta) validate() error {
	if m.FormatVersion < oldestFormatVersion || m.FormatVersion > formatVersion {
		return fmt.Errorf("formatVersion %d, want %d to %d", m.FormatVersion, oldestFormatVersion, formatVersion)
	}
	if m.Size <= 0 || m.Size%blockdev.BlockSize != 0 {
		return fmt.Errorf("size %d is not a positive multiple of %d", m.Size, blockdev.BlockSize)
	}
	if m.Size/blockdev.BlockSize > maxBlocks {
		return fmt.Errorf("size %d exceeds the maximum %d", m.Size, int64(maxBlocks)*blockdev.BlockSize)
	}
	if m.HeadIndex < 0 || m.HeadIndex > maxHeadIndex {
		return fmt.Errorf("headIndex %d out of range", m.HeadIndex)
	}
	if want := headFileName(m.HeadIndex); m.Head != want {
		return fmt.Errorf("head %q does not match headIndex %d (want %q)", m.Head, m.HeadIndex, want)
	}
	if m.BackingFile != "" && !filepath.IsAbs(m.BackingFile) {
		return fmt.Errorf("backingFile %q is not an absolute path", m.BackingFile)
	}
	if len(m.Snapshots) > maxSnapshots {
		return fmt.Errorf("%d snapshots exceed the maximum %d", len(m.Snapshots), maxSnapshots)
	}
	seen := make(map[string]bool, len(m.Snapshots))
	for _, s := range m.Snapshots {
		if err := types.ValidateSnapshotName(s); err != nil {
			return fmt.Errorf("snapshots: %w", err)
		}
		if seen[s] {
			return fmt.Errorf("snapshots: %q listed twice", s)
		}
		seen[s] = true
	}
	return nil
}

// layerMeta is the .meta file next to each layer image.
type layerMeta struct {
	Name        string            `json:"name"`
	Parent      string            `json:"parent"`
	Removed     bool              `json:"removed"`
	UserCreated bool              `json:"userCreated"`
	Created     string            `json:"created"`
	Labels      map[string]string `json:"labels,omitempty"`
	// ID names a snapshot layer's content: equal on two replicas only if
	// the layers hold the same blocks (see layerid.go). Empty for the head
	// and for layers written before IDs existed, which never match.
	ID string `json:"id,omitempty"`
}

func (m *layerMeta) validate() error {
	if m.Name != HeadName {
		if err := types.ValidateSnapshotName(m.Name); err != nil {
			return fmt.Errorf("name: %w", err)
		}
	}
	if m.Parent != "" {
		if err := types.ValidateSnapshotName(m.Parent); err != nil {
			return fmt.Errorf("parent: %w", err)
		}
		if m.Parent == m.Name {
			return fmt.Errorf("parent %q is the layer itself", m.Parent)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, m.Created); err != nil {
		return fmt.Errorf("created %q is not RFC 3339: %w", m.Created, err)
	}
	for k := range m.Labels {
		if k == "" {
			return errors.New("labels: empty key")
		}
	}
	if m.ID != "" {
		if err := validateLayerID(m.ID); err != nil {
			return err
		}
	}
	return nil
}

func (m *layerMeta) createdTime() time.Time {
	t, _ := time.Parse(time.RFC3339Nano, m.Created) // validated on load
	return t
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// decodeStrict decodes exactly one JSON object, refusing unknown fields and
// trailing data, so a damaged file is reported rather than half-read.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func parseVolumeMeta(data []byte) (volumeMeta, error) {
	var m volumeMeta
	if err := decodeStrict(data, &m); err != nil {
		return volumeMeta{}, err
	}
	if err := m.validate(); err != nil {
		return volumeMeta{}, err
	}
	return m, nil
}

func parseLayerMeta(data []byte) (layerMeta, error) {
	var m layerMeta
	if err := decodeStrict(data, &m); err != nil {
		return layerMeta{}, err
	}
	if err := m.validate(); err != nil {
		return layerMeta{}, err
	}
	return m, nil
}

// readMetaFile reads a .meta file, bounding its size; errors name the file.
func readMetaFile(dir, name string) ([]byte, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(data) > maxMetaBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, maxMetaBytes)
	}
	return data, nil
}

func loadVolumeMeta(dir string) (volumeMeta, error) {
	data, err := readMetaFile(dir, volumeMetaFile)
	if err != nil {
		return volumeMeta{}, fmt.Errorf("%w: %s: %w", ErrBadMeta, filepath.Join(dir, volumeMetaFile), err)
	}
	m, err := parseVolumeMeta(data)
	if err != nil {
		return volumeMeta{}, fmt.Errorf("%w: %s: %w", ErrBadMeta, filepath.Join(dir, volumeMetaFile), err)
	}
	return m, nil
}

func loadLayerMeta(dir, img string) (layerMeta, error) {
	name := img + metaSuffix
	data, err := readMetaFile(dir, name)
	if err != nil {
		return layerMeta{}, fmt.Errorf("%w: %s: %w", ErrBadMeta, filepath.Join(dir, name), err)
	}
	m, err := parseLayerMeta(data)
	if err != nil {
		return layerMeta{}, fmt.Errorf("%w: %s: %w", ErrBadMeta, filepath.Join(dir, name), err)
	}
	return m, nil
}

// writeFileAtomic replaces dir/name with data: temp file, fsync, rename.
// The caller fsyncs the directory once its renames are done, so that a batch
// of meta updates costs one directory sync.
func writeFileAtomic(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, tmpName(name))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fileMode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
	}
	return nil
}

func writeLayerMeta(dir, img string, m layerMeta) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(dir, img+metaSuffix, append(data, '\n'))
}

// commitVolumeMeta atomically replaces volume.meta and makes it durable: the
// commit point of a structural change. renamed says whether the new file
// replaced the old one; if so the caller must follow it even on error.
func commitVolumeMeta(dir string, m volumeMeta) (renamed bool, err error) {
	if err := m.validate(); err != nil {
		return false, fmt.Errorf("refusing to write invalid %s: %w", volumeMetaFile, err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return false, err
	}
	if err := writeFileAtomic(dir, volumeMetaFile, append(data, '\n')); err != nil {
		return false, err
	}
	return true, syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// isLayerFile reports whether a directory entry looks like one of ours, so
// Open only ever deletes files the replica could have created.
func isLayerFile(name string) bool {
	if !strings.HasPrefix(name, headPrefix) && !strings.HasPrefix(name, snapPrefix) {
		return false
	}
	return strings.HasSuffix(name, imgSuffix) || strings.HasSuffix(name, imgSuffix+metaSuffix) ||
		strings.HasSuffix(name, discardSuffix) || strings.HasSuffix(name, zeroSuffix)
}

func isTmpFile(name string) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, tmpSuffix)
}
