package imserver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/fusefile"
	"github.com/strata-storage/strata/engineapi"
)

// startFUSE serves the engine's volume as FUSEDir/<volume>/disk.
func (s *Server) startFUSE(inst *instance) error {
	if s.opts.FUSEDir == "" {
		return nil
	}
	dir := filepath.Dir(engineapi.FUSEFile(s.opts.FUSEDir, inst.spec.VolumeName))
	if err := fusefile.CleanStale(dir); err != nil {
		return fmt.Errorf("engine %s: %w", inst.spec.Name, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("engine %s: FUSE directory: %w", inst.spec.Name, err)
	}
	f, err := fusefile.Mount(dir, inst.eng, fusefile.Options{Name: engineapi.FUSEFileName, Log: s.log.WithField("engine", inst.spec.Name)})
	if err != nil {
		return fmt.Errorf("engine %s: serving the volume as a file: %w", inst.spec.Name, err)
	}
	inst.fuse = f
	return nil
}

// stopFUSE unmounts the volume's file; a loop device still on it gets I/O
// errors from then on, as it would from a stopped NBD export.
func (s *Server) stopFUSE(inst *instance) error {
	if inst.fuse == nil {
		return nil
	}
	dir := filepath.Dir(inst.fuse.Path())
	err := inst.fuse.Close()
	inst.fuse = nil
	if rmErr := os.Remove(dir); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		s.log.WithError(rmErr).Warn("Could not remove the FUSE directory")
	}
	return err
}

// cleanStaleFUSE unmounts what a killed instance manager left mounted in
// fuseDir: those files answer ENOTCONN and their directories cannot be
// mounted again until then.
func cleanStaleFUSE(fuseDir string, log logrus.FieldLogger) error {
	if fuseDir == "" {
		return nil
	}
	if err := os.MkdirAll(fuseDir, 0o700); err != nil {
		return fmt.Errorf("--fuse-dir %s: %w", fuseDir, err)
	}
	entries, err := os.ReadDir(fuseDir)
	if err != nil {
		return fmt.Errorf("--fuse-dir %s: %w", fuseDir, err)
	}
	for _, e := range entries {
		dir := filepath.Join(fuseDir, e.Name())
		if err := fusefile.CleanStale(dir); err != nil {
			return err
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.WithError(err).WithField("dir", dir).Warn("Could not remove a FUSE directory left behind")
		}
	}
	return nil
}
