package imserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// ReplicaDataDelete removes a replica's data directory: a manager deletes
// a replica for good after InstanceDelete (which keeps the data, so a
// stopped replica can be started again). Because the call removes a tree,
// it refuses anything that is not recognisably one replica's directory that
// nothing here uses.
//
//   - A directory that does not exist is success, so retries are safe.
//   - A path that is not absolute, not inside one of the node's disks (see
//     confine.go), not a directory, or a non-empty directory without
//     volume.meta is InvalidArgument.
//   - A directory a replica instance of this instance manager is registered
//     on (running or not; an instance in ERROR would recreate an empty
//     replica there at the next restart), or one inside or above such a
//     directory, or one being deleted by another call, is Aborted
//     (engineapi.ErrBusy).
func (s *Server) ReplicaDataDelete(_ context.Context, req *impb.ReplicaDataDeleteRequest) (*impb.Empty, error) {
	if err := s.deleteReplicaData(req.DataDir); err != nil {
		return nil, engineapi.ToStatus(err)
	}
	return &impb.Empty{}, nil
}

func (s *Server) deleteReplicaData(dir string) error {
	// Also refuses a relative path and the root directory.
	if err := s.conf.disk("data_dir", dir); err != nil {
		return err
	}
	dir = filepath.Clean(dir)

	s.mu.Lock()
	if err := s.dirFreeLocked("", dir); err != nil {
		s.mu.Unlock()
		return err
	}
	used := map[string]string{} // replica instance -> its data directory
	for name, inst := range s.instances {
		if inst.spec.Type == impb.InstanceType_INSTANCE_TYPE_REPLICA {
			used[name] = inst.spec.DataDir
		}
	}
	// From here on InstanceCreate refuses replicas in dir (dirFreeLocked).
	s.deleting[dir] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.deleting, dir)
		s.mu.Unlock()
	}()

	// The same directory may be spelt through a symbolic link; compare the
	// resolved paths too (outside s.mu: it touches the file system).
	resolved := resolvePath(dir)
	for name, other := range used {
		if pathsOverlap(dir, other) || pathsOverlap(resolved, resolvePath(other)) {
			return fmt.Errorf("data_dir %s: replica instance %s uses %s; delete the instance first: %w",
				dir, name, other, engineapi.ErrBusy)
		}
	}
	if err := removeReplicaDir(dir); err != nil {
		return err
	}
	s.log.WithField("dir", dir).Info("Replica data deleted")
	return nil
}

// removeReplicaDir deletes a replica directory, volume.meta last: a delete
// interrupted by a crash leaves either a directory that still proves it is
// a replica's or an empty one, so the retry is never refused.
func removeReplicaDir(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("data_dir %s: %w", dir, err)
	}
	if !fi.IsDir() {
		// A symbolic link included: the tree behind it is not ours to judge.
		return fmt.Errorf("data_dir %s is not a directory (%s): %w", dir, fi.Mode().Type(), engineapi.ErrInvalid)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("data_dir %s: %w", dir, err)
	}
	if len(entries) > 0 {
		meta, err := os.Lstat(filepath.Join(dir, replica.MetaFile))
		if err != nil || !meta.Mode().IsRegular() {
			return fmt.Errorf("data_dir %s holds %d entries but no %s; not a replica directory, left alone: %w",
				dir, len(entries), replica.MetaFile, engineapi.ErrInvalid)
		}
	}
	for _, e := range entries {
		if e.Name() == replica.MetaFile {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("data_dir %s: %w", dir, err)
		}
	}
	if err := os.Remove(filepath.Join(dir, replica.MetaFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("data_dir %s: %w", dir, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("data_dir %s: %w", dir, err)
	}
	return nil
}

// dirFreeLocked refuses a replica data directory that another replica
// instance (not name) is registered on, or that a ReplicaDataDelete is
// removing: two replicas on one directory, or a replica created while its
// directory is being removed, would corrupt it. The caller holds s.mu.
func (s *Server) dirFreeLocked(name, dir string) error {
	dir = filepath.Clean(dir)
	for d := range s.deleting {
		if pathsOverlap(dir, d) {
			return fmt.Errorf("data_dir %s: %s is being deleted: %w", dir, d, engineapi.ErrBusy)
		}
	}
	if name == "" {
		return nil // a delete: deleteReplicaData checks the instances itself
	}
	for other, inst := range s.instances {
		if other != name && inst.spec.Type == impb.InstanceType_INSTANCE_TYPE_REPLICA &&
			filepath.Clean(inst.spec.DataDir) == dir {
			return fmt.Errorf("data_dir %s is used by replica instance %s: %w", dir, other, engineapi.ErrBusy)
		}
	}
	return nil
}

// pathsOverlap tells whether two clean absolute paths are the same or one
// is inside the other.
func pathsOverlap(a, b string) bool {
	a, b = filepath.Clean(a), filepath.Clean(b)
	sep := string(filepath.Separator)
	return a == b || strings.HasPrefix(a, b+sep) || strings.HasPrefix(b, a+sep)
}

// resolvePath follows symbolic links in p as far as the path exists.
func resolvePath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	// A missing leaf: resolve the parent, which may still be a link.
	if r, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		return filepath.Join(r, filepath.Base(p))
	}
	return filepath.Clean(p)
}
