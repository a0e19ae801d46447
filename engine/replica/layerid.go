package replica

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Layer IDs let a rebuild keep the layers a returning replica already has.
// A snapshot layer's ID is meant to say "these exact blocks": two replicas'
// layers with the same name and the same ID hold the same data (a zero
// mark, zeromarks.go, and a block of zeros are the same block), so a
// rebuild may keep the target's own file instead of copying the source's.
//
//   - A snapshot takes the ID the engine sends (SnapshotOptions.ID, a
//     random nonce per snapshot operation, the same for every replica), so
//     replicas that took it at the same point of the write stream agree
//     and a name reused later gets another ID. Without one the replica
//     makes up its own, which matches nothing.
//   - An import (rebuild) gives each layer the source's ID.
//   - Whenever a purge changes a layer's blocks in place, the layer first
//     loses its ID (durably, before the first block changes) and gets the
//     new one only once the change is durable. A crash in between leaves a
//     layer without ID: it is copied by the next rebuild, never wrongly
//     kept. The new ID is a hash of what determines the new content, so
//     every replica doing the same purge step agrees, and one that missed
//     it keeps the old ID and no longer matches:
//   - coalesce of a removed R into its only child C: hash(R.ID, C.ID);
//     the result is C's blocks over R's whichever way the copy went.
//   - prune of a removed R under the head: hash(R.ID, extents punched or
//     unmarked), a zero mark counting as a block held.
//     Prune leaves what the volume reads unchanged, yet R's ID must change:
//     a replica whose R still held the punched blocks would read them
//     again once the head drops a block that no layer below holds any more
//     (Unmap after a reopen, or WriteZeroes, which punches instead of
//     zero-marking when nothing below holds the block), where the source
//     reads zeros. The punched set goes into the hash because replicas
//     prune at slightly different moments of the write stream and so may
//     punch different blocks.
//   - Layers with no ID (written before IDs existed, or after a crash
//     above) stay without one through any purge.
//
// Removing a snapshot changes a flag, not the data, and keeps the ID; a
// rebuild takes flags and labels from the source anyway.

// layerIDLen is the length of IDs this code makes: 32 hex digits.
const layerIDLen = 32

// NewLayerID returns a random ID, for an engine to send with a snapshot.
func NewLayerID() string {
	var b [layerIDLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validateLayerID(id string) error {
	if len(id) == 0 || len(id) > 64 {
		return fmt.Errorf("id %q: want 1 to 64 hex digits", id)
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("id %q: want lower-case hex digits", id)
		}
	}
	return nil
}

// ValidateLayerID checks an ID given from outside (by an engine).
func ValidateLayerID(id string) error { return validateLayerID(id) }

func hashID(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))[:layerIDLen]
}

// coalescedID is the ID of child c after removed parent rem is merged into
// it; "" if either had none.
func coalescedID(rem, c string) string {
	if rem == "" || c == "" {
		return ""
	}
	return hashID([]byte("coalesce"), []byte(rem), []byte(c))
}

// prunedID is the ID of a layer after the extents punched were punched out
// of it; "" if it had none.
func prunedID(id string, punched []Extent) string {
	if id == "" {
		return ""
	}
	ext := make([]byte, 0, 16*len(punched))
	for _, e := range punched {
		ext = binary.BigEndian.AppendUint64(ext, uint64(e.Offset))
		ext = binary.BigEndian.AppendUint64(ext, uint64(e.Length))
	}
	return hashID([]byte("prune"), []byte(id), ext)
}

// setLayerMeta writes a snapshot's .meta durably and then updates memory;
// the caller holds opMu.
func (r *Replica) setLayerMeta(l *layer, m layerMeta) error {
	if err := writeLayerMeta(r.dir, l.file, m); err != nil {
		return err
	}
	if err := syncDir(r.dir); err != nil {
		return err
	}
	r.mu.Lock()
	l.meta = m
	r.mu.Unlock()
	return nil
}

// forgetLayerID durably clears the IDs of layers whose blocks are about to
// change in place; a no-op for layers without one.
func (r *Replica) forgetLayerID(ls ...*layer) error {
	for _, l := range ls {
		if l.meta.ID == "" {
			continue
		}
		m := l.meta
		m.ID = ""
		if err := r.setLayerMeta(l, m); err != nil {
			return fmt.Errorf("clear the id of %s: %w", l.file, err)
		}
	}
	return nil
}
