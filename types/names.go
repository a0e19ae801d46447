package types

import (
	"errors"
	"fmt"
	"regexp"
)

// VolumeHeadName is the name of a volume's live, writable head layer in an
// engine's or replica's chain. It is reserved: no snapshot can take it.
// Defined here, not in the data plane, so the webhook and the controllers
// need not import engine/ for it.
const VolumeHeadName = "volume-head"

// ErrInvalidSnapshotName is wrapped by every error of ValidateSnapshotName.
// engine/replica exports it as replica.ErrInvalidName.
var ErrInvalidSnapshotName = errors.New("invalid snapshot name")

var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidateSnapshotName checks that name is usable as a snapshot name: the
// replicas put it into file names, so only a safe character set is allowed,
// and VolumeHeadName is taken. Its errors wrap ErrInvalidSnapshotName.
func ValidateSnapshotName(name string) error {
	if !snapshotNameRE.MatchString(name) {
		return fmt.Errorf("%w: %q must match %s", ErrInvalidSnapshotName, name, snapshotNameRE)
	}
	if name == VolumeHeadName {
		return fmt.Errorf("%w: %q is reserved for the head", ErrInvalidSnapshotName, name)
	}
	return nil
}
