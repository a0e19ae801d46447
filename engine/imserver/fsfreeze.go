package imserver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/fsfreeze"
)

// Filesystem-consistent snapshots (issue 43). The engine cuts a snapshot
// at one point of the block device's write stream; what the application
// wrote but the node's page cache still holds is not there yet. So, when
// the manager asks (fs_freeze_timeout_ms), the instance manager asks its
// node's CSI plugin, which holds the volume's mount, to freeze the
// filesystem (internal/fsfreeze) before the cut and thaw it after. The
// freeze is outside the instance's lock and never in the I/O path: the
// flush it causes comes back to this engine as ordinary writes.
//
// The plugin's answer says what the snapshot holds, and is recorded in
// its label fsfreeze.ConsistencyLabel. No plugin on this node (a volume
// used over raw NBD, a node without CSI) gives a crash-consistent
// snapshot, said so; a plugin that answers with an error fails the
// snapshot, which the manager retries.

// fsFreezer is what the instance manager asks of the node's CSI plugin.
type fsFreezer interface {
	Freeze(ctx context.Context, volume, id string, timeout time.Duration) (fsfreeze.Consistency, error)
	Thaw(ctx context.Context, volume, id string) error
}

// thawTimeout bounds a thaw call; the plugin's watchdog thaws anyway.
const thawTimeout = 10 * time.Second

// freezeFS freezes volume's filesystem for cut id if asked (timeout > 0)
// and returns what the snapshot will hold.
func (s *Server) freezeFS(ctx context.Context, volume, id string, timeout time.Duration) (fsfreeze.Consistency, error) {
	if timeout <= 0 || s.fsFreezer == nil {
		return fsfreeze.Crash, nil
	}
	if timeout > fsfreeze.MaxTimeout {
		return "", fmt.Errorf("fs_freeze_timeout_ms %d: at most %d: %w", timeout.Milliseconds(),
			fsfreeze.MaxTimeout.Milliseconds(), engineapi.ErrInvalid)
	}
	c, err := s.fsFreezer.Freeze(ctx, volume, id, timeout)
	switch {
	case errors.Is(err, fsfreeze.ErrNoPlugin):
		return fsfreeze.Crash, nil
	case err != nil:
		return "", fmt.Errorf("freezing the filesystem of volume %s for snapshot %s (the snapshot is not taken; "+
			"spec.freezeFilesystemForSnapshot: disabled takes crash-consistent ones): %w", volume, id, err)
	}
	return c, nil
}

// thawFS ends what freezeFS began; an error means the freeze ended before
// the thaw (the cut may have missed it) or the thaw failed.
func (s *Server) thawFS(volume, id string, c fsfreeze.Consistency) error {
	if c != fsfreeze.Filesystem {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), thawTimeout)
	defer cancel()
	if err := s.fsFreezer.Thaw(ctx, volume, id); err != nil {
		return fmt.Errorf("thawing the filesystem of volume %s after snapshot %s: %w", volume, id, err)
	}
	return nil
}

// withConsistency returns labels with the consistency label set.
func withConsistency(labels map[string]string, c fsfreeze.Consistency) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	out[fsfreeze.ConsistencyLabel] = string(c)
	return out
}

func fsCutKey(engine, cut string) string { return engine + "/" + cut }
