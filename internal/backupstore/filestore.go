package backupstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/strata-storage/strata/internal/atomicfile"
)

// FileStore is an ObjectStore on a directory (a file:// target, typically
// an NFS mount). Every write goes to a dot-named temp file, is fsynced and
// then renamed or linked into place, so a crash never leaves a torn object
// under a real key; the directory entries it creates and removes are
// fsynced too (internal/atomicfile), so a crash loses none of them.
type FileStore struct {
	root string
}

// The objects are the users' volume data: the owner's only, as are the
// directories the store creates (the umask can only narrow dirMode).
const (
	fileMode fs.FileMode = 0o600
	dirMode  fs.FileMode = 0o700
)

// NewFileStore returns a store rooted at dir, which must exist: a missing
// root is an unmounted target, and creating it would hide that.
func NewFileStore(dir string) (*FileStore, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("backup target %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("backup target %s: not a directory", dir)
	}
	return &FileStore{root: dir}, nil
}

func (s *FileStore) path(key string) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

// writePath checks key and makes the directory its object goes in.
func (s *FileStore) writePath(key string) (string, error) {
	p, err := s.path(key)
	if err != nil {
		return "", err
	}
	if err := atomicfile.MkdirAll(filepath.Dir(p), dirMode); err != nil {
		return "", err
	}
	return p, nil
}

// Put writes r to key through atomicfile (temp, fsync, rename, fsync dir).
func (s *FileStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	p, err := s.writePath(key)
	if err == nil {
		err = atomicfile.WriteFunc(p, fileMode, func(w io.Writer) error {
			n, err := io.Copy(w, r)
			if err == nil && size >= 0 && n != size {
				err = fmt.Errorf("wrote %d bytes, want %d", n, size)
			}
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// PutIfAbsent writes through atomicfile.CreateFunc (temp, fsync, link,
// fsync dir): link fails instead of replacing, so of two racing writers
// exactly one wins, on local disks and on NFS alike.
func (s *FileStore) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	p, err := s.writePath(key)
	if err == nil {
		err = atomicfile.CreateFunc(p, fileMode, func(w io.Writer) error {
			_, err := w.Write(data)
			return err
		})
	}
	switch {
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%s: %w", key, ErrExists)
	case err != nil:
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

func (s *FileStore) open(key string) (*os.File, error) {
	p, err := s.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	return f, err
}

func (s *FileStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.open(key)
}

type sectionCloser struct {
	*io.SectionReader
	io.Closer
}

func (s *FileStore) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("get %s: invalid range %d+%d", key, off, n)
	}
	f, err := s.open(key)
	if err != nil {
		return nil, err
	}
	return sectionCloser{io.NewSectionReader(f, off, n), f}, nil
}

func (s *FileStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	p, err := s.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return ObjectInfo{}, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	if err != nil {
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// List walks the directory holding prefix. The root is checked first: a
// vanished root is an error, never an empty listing.
func (s *FileStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if _, err := os.Stat(s.root); err != nil {
		return nil, fmt.Errorf("list %q: backup target root: %w", prefix, err)
	}
	dir := path.Dir(prefix + "x") // the directory part of prefix ("." for none)
	start := filepath.Join(s.root, filepath.FromSlash(dir))
	var out []ObjectInfo
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll // nothing under this prefix yet
			}
			return err
		}
		if strings.HasPrefix(d.Name(), ".") && p != start {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil // temp files of writes in progress
		}
		if d.IsDir() {
			return ctx.Err()
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted while walking
		}
		if err != nil {
			return err
		}
		out = append(out, ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Delete removes key's file and fsyncs its directory (atomicfile.Remove):
// GC deletes index objects before their packs, and a backup's manifest
// before GC frees its packs, so a deletion a crash undid could bring back
// an index or a manifest naming a pack that is gone.
func (s *FileStore) Delete(ctx context.Context, key string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	if err := atomicfile.Remove(p); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}
