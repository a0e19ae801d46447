// Package backupstore is Strata's backup format on an object store: fixed-size
// chunks addressed by SHA-256, compressed with zstd, deduplicated across every
// backup of every volume on the target and packed into large immutable
// objects, with a manifest per backup written last and atomically. It knows
// nothing of Kubernetes: the backup controller drives it. docs/backupstore.md
// describes the layout and the reasons for it.
package backupstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// ErrNotFound is returned by Get, GetRange and Stat for a key that does not
// exist.
var ErrNotFound = errors.New("object not found")

// ErrExists is returned by PutIfAbsent when the key already exists.
var ErrExists = errors.New("object already exists")

// ObjectInfo describes one stored object. ModTime is the store's clock, so
// ages computed from it are immune to skew between the writer's clocks.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// ObjectStore is the little the format needs from a backup target; it maps
// onto S3 (PUT, PUT If-None-Match: *, GET, ranged GET, HEAD, ListObjectsV2,
// DELETE) and onto a directory (FileStore). Keys are '/'-separated.
type ObjectStore interface {
	// Put stores r (size bytes) under key, replacing any object there. The
	// format only overwrites the inflight markers; every other object is
	// immutable and content-addressed, so a replay writes the same bytes.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// PutIfAbsent stores data under key only if nothing is there, atomically;
	// otherwise it returns ErrExists.
	PutIfAbsent(ctx context.Context, key string, data []byte) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// GetRange reads n bytes at off; a reader that ends early means the
	// object is shorter, which callers detect with io.ReadFull.
	GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// List returns every object whose key starts with prefix, in key order.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// Delete removes key; deleting a missing key is not an error (as on S3).
	Delete(ctx context.Context, key string) error
}

// checkKey rejects keys that could escape a FileStore's root or collide with
// its temp files: empty segments, "." and "..", and names starting with '.'.
func checkKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") {
		return fmt.Errorf("invalid object key %q", key)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || strings.HasPrefix(seg, ".") {
			return fmt.Errorf("invalid object key %q: empty or dot segment %q", key, seg)
		}
	}
	return nil
}

// readAll reads a whole object, refusing one larger than limit so a corrupt
// or hostile store cannot make the reader allocate without bound.
func readAll(ctx context.Context, s ObjectStore, key string, limit int64) ([]byte, error) {
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("read %s: larger than %d bytes", key, limit)
	}
	return data, nil
}
