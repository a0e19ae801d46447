package types

import "math"

// BlockSize is the unit the data plane tracks data in, in bytes; a volume's
// size is a whole number of blocks. It lives here, not in engine/blockdev
// (which uses it), so the CSI driver and the webhook can round sizes without
// importing the data plane.
const BlockSize = 4096

// maxBlockAligned is the largest int64 that is a whole number of blocks.
const maxBlockAligned = math.MaxInt64 / BlockSize * BlockSize

// RoundUpToBlock is size rounded up to a whole number of blocks (0 stays 0).
// ok is false, and size is returned as it is, when size is negative or its
// rounded value does not fit in an int64.
func RoundUpToBlock(size int64) (rounded int64, ok bool) {
	if size < 0 || size > maxBlockAligned {
		return size, false
	}
	return (size + BlockSize - 1) / BlockSize * BlockSize, true
}
