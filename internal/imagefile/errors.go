package imagefile

import (
	"errors"
	"fmt"
)

// The errors that are facts about a source's bytes or address: fetching
// the same source again gives the same answer, so a caller has no reason to
// retry it. A Prepare or Download error wraps one of them (errors.Is) when
// it is one; any other error (a read, a write, a stalled server, qemu-img
// missing) may pass on a retry.
var (
	// ErrChecksumMismatch: the raw data's SHA-512 is not the one wanted.
	ErrChecksumMismatch = errors.New("checksum mismatch")
	// ErrNotAnImage: the source is no disk image Strata takes — a format
	// refused by name, a raw file of partial sectors, formats nested too
	// deep, a qcow2 with a backing file or an external data file. An HTML
	// page is not one of these: a proxy's or server's error page may well
	// be gone on the next try.
	ErrNotAnImage = errors.New("not a usable disk image")
	// ErrLimitExceeded: the source is larger than a cap allows (its
	// download, its decompressed bytes, its virtual size). The error is a
	// *LimitError, which names the cap.
	ErrLimitExceeded = errors.New("larger than allowed")
	// ErrAddressRefused: the download would connect to an address that
	// downloads may not reach (the node's own services, the cloud metadata
	// endpoints, the cluster's and the cloud's internal networks), or
	// follow a redirect to a scheme other than http(s).
	ErrAddressRefused = errors.New("address refused")
)

// notAnImageError keeps its own message (the one the user reads) and is
// ErrNotAnImage for errors.Is.
type notAnImageError struct{ msg string }

func (e *notAnImageError) Error() string        { return e.msg }
func (e *notAnImageError) Is(target error) bool { return target == ErrNotAnImage }

func notAnImage(format string, args ...any) error {
	return &notAnImageError{msg: fmt.Sprintf(format, args...)}
}

// Limit names one of the caps of Limits, so a caller can tell the user
// which setting to raise.
type Limit string

const (
	// LimitVirtualSize caps the raw image, and with a margin every
	// decompressed stage before it (Limits.MaxVirtualSize).
	LimitVirtualSize Limit = "virtual size"
	// LimitDownloadSize caps the bytes a download may bring (DownloadPolicy.MaxSize).
	LimitDownloadSize Limit = "download size"
)

// LimitError is a source refused for its size; it is ErrLimitExceeded for
// errors.Is.
type LimitError struct {
	Limit Limit
	// Max is the cap in bytes.
	Max int64
	// Message says what passed the cap, for the user.
	Message string
}

func (e *LimitError) Error() string        { return e.Message }
func (e *LimitError) Is(target error) bool { return target == ErrLimitExceeded }

func limitExceeded(limit Limit, max int64, format string, args ...any) error {
	return &LimitError{Limit: limit, Max: max, Message: fmt.Sprintf(format, args...)}
}

// addressRefusedError keeps its message and is ErrAddressRefused.
type addressRefusedError struct{ msg string }

func (e *addressRefusedError) Error() string        { return e.msg }
func (e *addressRefusedError) Is(target error) bool { return target == ErrAddressRefused }
