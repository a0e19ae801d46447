package imagefile

import (
	"errors"
	"fmt"
)

// The errors that are facts about a source's bytes: fetching the same
// source again gives the same answer, so a caller has no reason to retry
// it. A Prepare error wraps one of them (errors.Is) when it is one; any
// other error (a read, a write, qemu-img missing) may pass on a retry.
var (
	// ErrChecksumMismatch: the raw data's SHA-512 is not the one wanted.
	ErrChecksumMismatch = errors.New("checksum mismatch")
	// ErrNotAnImage: the source is no disk image Strata takes — a format
	// refused by name, a raw file of partial sectors, formats nested too
	// deep, a qcow2 with a backing file. An HTML page is not one of these:
	// a proxy's or server's error page may well be gone on the next try.
	ErrNotAnImage = errors.New("not a usable disk image")
)

// notAnImageError keeps its own message (the one the user reads) and is
// ErrNotAnImage for errors.Is.
type notAnImageError struct{ msg string }

func (e *notAnImageError) Error() string        { return e.msg }
func (e *notAnImageError) Is(target error) bool { return target == ErrNotAnImage }

func notAnImage(format string, args ...any) error {
	return &notAnImageError{msg: fmt.Sprintf(format, args...)}
}
