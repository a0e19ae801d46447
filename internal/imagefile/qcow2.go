package imagefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/strata-storage/strata/types"
)

// The qcow2 header, as far as Strata checks it before qemu-img sees the
// file (QEMU's docs/interop/qcow2.txt). qemu-img opens every file an image
// names — a backing file, an external data file — as soon as it opens the
// image, even for "info"; so these are read here, in Go, and such an image
// never reaches qemu-img at all.
const (
	qcow2V2HeaderLen = 72  // version 2 ends at the snapshots offset
	qcow2V3HeaderLen = 104 // version 3 adds feature bits, refcount order, header length
	// qcow2 clusters are 512 B to 2 MiB; header extensions lie in the first.
	qcow2MinClusterBits = 9
	qcow2MaxClusterBits = 21
	// qcow2MaxNameLen bounds a backing or data file name as QEMU does.
	qcow2MaxNameLen = 1023
	// Incompatible feature bit 2: the guest data lives in an external file
	// (data_file); autoclear bit 1 (data_file_raw) makes that file a raw
	// image of the disk, so converting the image copies the host file.
	qcow2IncompatExternalData = 1 << 2
	qcow2ExtEnd               = 0x00000000
	qcow2ExtDataFile          = 0x44415441 // "DATA": the external data file's name
)

// qcow2Header is what the checks need of a qcow2 header.
type qcow2Header struct {
	version       uint32
	backingOffset uint64
	backingSize   uint32
	clusterBits   uint32
	virtualSize   uint64
	cryptMethod   uint32
	incompatible  uint64
	headerLength  uint32
	backingFile   string
	// dataFile is the external data file's name, when the header names one.
	dataFile    string
	hasDataFile bool
}

// readQCOW2Header reads the header and its extensions from the file's first
// cluster (at most 2 MiB: a bounded read whatever the file claims).
func readQCOW2Header(path string) (*qcow2Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fixed := make([]byte, qcow2V3HeaderLen)
	n, err := io.ReadFull(f, fixed)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("reading the qcow2 header of %s: %w", path, err)
	}
	h, err := parseQCOW2Fixed(fixed[:n])
	if err != nil {
		return nil, err
	}
	cluster := make([]byte, 1<<h.clusterBits)
	n, err = f.ReadAt(cluster, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading the first qcow2 cluster of %s: %w", path, err)
	}
	return h, h.parseRest(cluster[:n])
}

// parseQCOW2Fixed reads the fixed part of the header (big-endian fields).
func parseQCOW2Fixed(b []byte) (*qcow2Header, error) {
	if len(b) < qcow2V2HeaderLen {
		return nil, notAnImage("the qcow2 header is truncated (%d bytes)", len(b))
	}
	be := binary.BigEndian
	h := &qcow2Header{
		version:       be.Uint32(b[4:]),
		backingOffset: be.Uint64(b[8:]),
		backingSize:   be.Uint32(b[16:]),
		clusterBits:   be.Uint32(b[20:]),
		virtualSize:   be.Uint64(b[24:]),
		cryptMethod:   be.Uint32(b[32:]),
		headerLength:  qcow2V2HeaderLen,
	}
	switch h.version {
	case 2:
	case 3:
		if len(b) < qcow2V3HeaderLen {
			return nil, notAnImage("the qcow2 version 3 header is truncated (%d bytes)", len(b))
		}
		h.incompatible = be.Uint64(b[72:])
		h.headerLength = be.Uint32(b[100:])
		if h.headerLength < qcow2V3HeaderLen {
			return nil, notAnImage("the qcow2 header length %d is below %d", h.headerLength, qcow2V3HeaderLen)
		}
	default:
		return nil, notAnImage("qcow2 version %d: only versions 2 and 3 are taken", h.version)
	}
	if h.clusterBits < qcow2MinClusterBits || h.clusterBits > qcow2MaxClusterBits {
		return nil, notAnImage("qcow2 cluster bits %d: not in [%d, %d]", h.clusterBits, qcow2MinClusterBits, qcow2MaxClusterBits)
	}
	return h, nil
}

// parseRest reads the header extensions and the backing file name from the
// first cluster.
func (h *qcow2Header) parseRest(cluster []byte) error {
	if h.backingOffset != 0 {
		h.backingFile = nameAt(cluster, h.backingOffset, uint64(h.backingSize))
	}
	off := uint64(h.headerLength)
	for off+8 <= uint64(len(cluster)) {
		typ := binary.BigEndian.Uint32(cluster[off:])
		length := uint64(binary.BigEndian.Uint32(cluster[off+4:]))
		if typ == qcow2ExtEnd {
			return nil
		}
		if off+8+length > uint64(len(cluster)) {
			return notAnImage("qcow2 header extension 0x%08x at offset %d runs past the first cluster", typ, off)
		}
		if typ == qcow2ExtDataFile {
			h.hasDataFile = true
			h.dataFile = nameAt(cluster, off+8, length)
		}
		off += 8 + (length+7)&^7 // extension data is padded to 8 bytes
	}
	return nil
}

// nameAt is the file name at off in the first cluster, cut to what QEMU
// takes; "(beyond the first cluster)" when it lies further (it is refused
// either way, the name only goes into the message).
func nameAt(cluster []byte, off, size uint64) string {
	size = min(size, qcow2MaxNameLen)
	if off >= uint64(len(cluster)) || off+size > uint64(len(cluster)) {
		return "(beyond the first cluster)"
	}
	return string(bytes.TrimRight(cluster[off:off+size], "\x00"))
}

// check refuses what qemu-img must never open: an image that names another
// file (a backing file, an external data file: either would make it read a
// file of this node into the volume), an encrypted image, one larger than
// the cap. Names are quoted: they come from the image and go into status.
func (h *qcow2Header) check(limits Limits) error {
	switch {
	case h.backingOffset != 0:
		return notAnImage("the qcow2 image has a backing file (%q); only self-contained images are taken", h.backingFile)
	case h.incompatible&qcow2IncompatExternalData != 0 || h.hasDataFile:
		return notAnImage("qcow2 image with an external data file (data_file=%q): refused, it would read a file of the host", h.dataFile)
	case h.cryptMethod != 0:
		return notAnImage("the qcow2 image is encrypted (method %d); only unencrypted images are taken", h.cryptMethod)
	}
	return checkVirtualSize("the qcow2 image's virtual size", h.virtualSize, limits)
}

// checkVirtualSize refuses a raw image larger than the cap.
func checkVirtualSize(what string, size uint64, limits Limits) error {
	if max := limits.maxVirtualSize(); size > uint64(max) {
		return limitExceeded(LimitVirtualSize, max, "%s is %s (%d bytes), more than the cap of %s",
			what, types.ApproxBytes(int64(min(size, 1<<62))), size, types.ApproxBytes(max))
	}
	return nil
}
