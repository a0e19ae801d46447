// Package blockdev is the one interface every layer of the data plane speaks:
// a replica, the engine that replicates over replicas, the data-connection
// client that reaches a remote replica, and the NBD frontend that serves any
// of them. It has no Kubernetes or gRPC imports.
package blockdev

import (
	"errors"
	"fmt"
	"io"

	"github.com/strata-storage/strata/types"
)

// BlockSize is the unit the data plane tracks data in. I/O may be unaligned;
// devices handle the read-modify-write. Defined in types, whose size
// rounding the CSI driver and the webhook use.
const BlockSize = types.BlockSize

// Device is a block device of fixed size.
type Device interface {
	io.ReaderAt
	io.WriterAt
	// Size is the device size in bytes.
	Size() int64
	// Flush makes every acknowledged write durable.
	Flush() error
	// Unmap tells the device a range is unused. Until it is written again its
	// content is unspecified (the NBD TRIM contract), so a device may free
	// space only where that cannot reveal older data.
	Unmap(off, length int64) error
	// WriteZeroes makes a range read back as zeros, freeing space where it can.
	WriteZeroes(off, length int64) error
}

// ErrOutOfRange is returned for I/O that does not fit inside the device.
var ErrOutOfRange = errors.New("I/O beyond the end of the device")

// CheckRange validates an I/O request against a device size.
func CheckRange(off, length, size int64) error {
	if off < 0 || length < 0 || off > size || length > size-off {
		return fmt.Errorf("%w: offset %d length %d size %d", ErrOutOfRange, off, length, size)
	}
	return nil
}
