// Package replicactl names the control calls an engine makes on a replica
// over its data connection, with their arguments and replies. The replica
// side (engine/replicaserver) and the engine side (engine/replication) share
// these so neither spells a method name twice.
package replicactl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/types"
)

// Control methods.
const (
	// SnapshotCheck validates a snapshot (name, limits) without taking it,
	// so an engine can refuse a snapshot before any replica has it.
	SnapshotCheck = "snapshot-check"
	Snapshot      = "snapshot"
	Remove        = "remove"
	// PurgeStart starts a purge in the background; PurgeStatus reports it.
	PurgeStart  = "purge-start"
	PurgeStatus = "purge-status"
	Revert      = "revert"
	Chain       = "chain"
	Expand      = "expand"
	SetLimits   = "set-limits"
	Extents     = "extents"
	ReadLayer   = "read-layer"

	// Rebuild: the engine fills a new replica with a healthy replica's
	// snapshots while the new one takes the volume's writes. ImportBegin
	// (ImportBeginArgs, or none) must come before the first write;
	// ImportWrite stages layer data; ImportCommit puts the staged layers,
	// and the replica's own layers it keeps, under the head in one
	// crash-safe step; ImportAbort drops the staged data.
	ImportBegin  = "import-begin"
	ImportWrite  = "import-write"
	ImportCommit = "import-commit"
	ImportAbort  = "import-abort"
)

// MaxImportWrite bounds the data of one ImportWrite, and of one ReadLayer.
const MaxImportWrite = 4 << 20

// ImportWriteArgs carry whole blocks of one snapshot layer. Zeroes, when
// Data is empty, stands for that many zero bytes (blocks the layer holds
// as zeros), so they need not travel. The data may also follow the JSON
// args raw (dataconn.Raw), after a newline, which JSON encoding never
// produces: see ImportWritePayload.
type ImportWriteArgs struct {
	Layer  string `json:"layer"`
	Offset int64  `json:"offset"`
	Data   []byte `json:"data,omitempty"`
	Zeroes int64  `json:"zeroes,omitempty"`
}

// ImportWritePayload is import-write args with the data raw after them.
func ImportWritePayload(a ImportWriteArgs, data []byte) ([]byte, error) {
	a.Data = nil
	head, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(head)+1+len(data))
	return append(append(append(out, head...), '\n'), data...), nil
}

// SplitImportWrite parses import-write args, with or without raw data.
func SplitImportWrite(raw []byte) (ImportWriteArgs, []byte, error) {
	var a ImportWriteArgs
	head, data, hasRaw := bytes.Cut(raw, []byte{'\n'})
	if err := json.Unmarshal(head, &a); err != nil {
		return a, nil, err
	}
	if !hasRaw {
		return a, a.Data, nil
	}
	if len(a.Data) > 0 {
		return a, nil, errors.New("import-write: data both in the JSON args and raw")
	}
	return a, data, nil
}

// ImportBeginArgs: with Reuse, a replica that is not empty is accepted:
// its head is replaced by an empty one and its snapshots wait for the
// commit to keep or drop them (replica.ImportOptions).
type ImportBeginArgs struct {
	Reuse bool `json:"reuse,omitempty"`
}

// ImportCommitArgs name the imported snapshots (Name, Parent, Removed,
// UserCreated, Created, Labels and ID of each Layer are used) and the
// snapshot the head goes on. Keep names layers of Layers that were not
// staged: the replica's own snapshot of that name, with the same ID, is
// used. The replica's other snapshots are dropped.
type ImportCommitArgs struct {
	Layers     []Layer  `json:"layers"`
	HeadParent string   `json:"headParent"`
	Keep       []string `json:"keep,omitempty"`
}

// Reusable reports whether a rebuild may keep target layer t for source
// layer s instead of copying it: same name and the same known ID, which
// says they hold the same blocks (see replica/layerid.go).
func Reusable(s, t Layer) bool {
	return s.Name != HeadName && s.Name == t.Name && s.ID != "" && s.ID == t.ID
}

// SnapshotArgs are the arguments of SnapshotCheck and Snapshot.
type SnapshotArgs struct {
	Name        string            `json:"name"`
	UserCreated bool              `json:"userCreated"`
	Created     time.Time         `json:"created"`
	Labels      map[string]string `json:"labels,omitempty"`
	// ID names the snapshot's content; an engine sends every replica the
	// same (NewLayerID), so their layers can be matched by a rebuild.
	ID string `json:"id,omitempty"`
}

// NewLayerID returns a fresh snapshot ID.
func NewLayerID() string { return replica.NewLayerID() }

// NameArgs name one snapshot (Remove, Revert) or layer (Extents: a
// snapshot, HeadName or BackingName).
type NameArgs struct {
	Name string `json:"name"`
}

// SizeArgs carry a new volume size (Expand).
type SizeArgs struct {
	Size int64 `json:"size"`
}

// LimitsArgs are snapshot limits; 0 means none.
type LimitsArgs struct {
	MaxCount int   `json:"maxCount"`
	MaxSize  int64 `json:"maxSize"`
}

// ReadLayerArgs read raw data of one layer (a snapshot, HeadName or
// BackingName). The reply is the data as a JSON byte string, or with Raw
// the bytes themselves (dataconn.Raw).
type ReadLayerArgs struct {
	Layer  string `json:"layer"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	Raw    bool   `json:"raw,omitempty"`
}

// Layer is one layer of a replica's chain.
type Layer struct {
	Name        string            `json:"name"`
	Parent      string            `json:"parent"`
	Children    []string          `json:"children,omitempty"`
	Removed     bool              `json:"removed"`
	UserCreated bool              `json:"userCreated"`
	Created     string            `json:"created"`
	Size        int64             `json:"size"`
	Labels      map[string]string `json:"labels,omitempty"`
	// ID names a snapshot's content: the same on every replica holding the
	// same blocks under that name; "" when unknown (never matches).
	ID string `json:"id,omitempty"`
	// Exclusive: a snapshot's allocated bytes its deletion would free now.
	Exclusive int64 `json:"exclusive,omitempty"`
}

// ChainReply is a replica's chain, keyed by layer name; the head is
// HeadName. The backing file is not in Layers (it is no snapshot: those
// who list or copy snapshots must not meet it) but in Backing.
type ChainReply struct {
	VolumeSize int64            `json:"volumeSize"`
	Layers     map[string]Layer `json:"layers"`
	Backing    *Backing         `json:"backing,omitempty"`
}

// Backing describes a replica's backing file: the read-only layer under
// its root snapshots, read with Extents and ReadLayer as BackingName.
type Backing struct {
	File string `json:"file"` // path on the replica's node
	Size int64  `json:"size"` // bytes; the volume reads zeros past it
}

// HeadName is the name the live head goes by in a chain.
const HeadName = types.VolumeHeadName

// BackingName is the name of the backing layer in Extents and ReadLayer;
// no snapshot can have it.
const BackingName = replica.BackingName

// ErrBackingMismatch: two replicas that must read alike have backing files
// that cannot be the same image.
var ErrBackingMismatch = errors.New("backing files differ")

// SameBacking checks that replicas aName and bName, with backing files a
// and b (nil for none), can read alike below their snapshots: both have
// one, of the same size, or neither has. The content is not compared (that
// would read both files); the backing image's own checksum vouches for
// copies of it.
func SameBacking(aName string, a *Backing, bName string, b *Backing) error {
	switch {
	case a == nil && b == nil:
		return nil
	case a == nil:
		return fmt.Errorf("%w: %s has none, %s has %s", ErrBackingMismatch, aName, bName, b.File)
	case b == nil:
		return fmt.Errorf("%w: %s has %s, %s has none", ErrBackingMismatch, aName, a.File, bName)
	case a.Size != b.Size:
		return fmt.Errorf("%w: %s has %s of %d bytes, %s has %s of %d", ErrBackingMismatch,
			aName, a.File, a.Size, bName, b.File, b.Size)
	}
	return nil
}

// PurgeStatusReply is a replica's purge progress.
type PurgeStatusReply struct {
	IsPurging bool   `json:"isPurging"`
	Progress  int    `json:"progress"`
	State     string `json:"state"`
	Error     string `json:"error,omitempty"`
}

// Extent is a run of data in a layer.
type Extent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}
