package backupstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/internal/devtools/s3server"
)

// The S3 store against a real S3-compatible server: versitygw on loopback
// (built by scripts/build-tools.sh, cached outside the clone).

var (
	versitygwOnce sync.Once
	versitygwBin  string
	versitygwErr  error
)

func startS3(t *testing.T) (*s3server.Server, S3Config) {
	t.Helper()
	versitygwOnce.Do(func() {
		root, err := repoRoot()
		if err == nil {
			versitygwBin, err = s3server.Binary(context.Background(), root)
		}
		versitygwErr = err
	})
	require.NoError(t, versitygwErr)
	srv, err := s3server.Start(versitygwBin, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	cfg := S3Config{Endpoint: srv.Endpoint, Bucket: "backups", Region: "us-east-1", Prefix: "cluster-a",
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
	s3, err := NewS3Store(cfg)
	require.NoError(t, err)
	require.NoError(t, s3.MakeBucket(context.Background()))
	return srv, cfg
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	for err == nil {
		if _, statErr := os.Stat(filepath.Join(dir, "go.mod")); statErr == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = filepath.Dir(dir)
	}
	return "", err
}

func TestS3Store(t *testing.T) {
	ctx := context.Background()
	_, cfg := startS3(t)
	s, err := NewS3Store(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Check(ctx))

	require.NoError(t, s.Put(ctx, "a/b/c", bytes.NewReader([]byte("hello")), 5))
	require.NoError(t, s.Put(ctx, "a/bc", bytes.NewReader([]byte("x")), 1))
	objs, err := s.List(ctx, "a/b")
	require.NoError(t, err)
	assert.Equal(t, []string{"a/b/c", "a/bc"}, keys(objs), "keys come back without the target's prefix")
	objs, err = s.List(ctx, "nothing/")
	require.NoError(t, err)
	assert.Empty(t, objs)

	rc, err := s.GetRange(ctx, "a/b/c", 1, 3)
	require.NoError(t, err)
	got, _ := io.ReadAll(rc)
	rc.Close()
	assert.Equal(t, "ell", string(got))
	info, err := s.Stat(ctx, "a/b/c")
	require.NoError(t, err)
	assert.Equal(t, int64(5), info.Size)

	_, err = s.Get(ctx, "a/missing")
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = s.Stat(ctx, "a/missing")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.NoError(t, s.Delete(ctx, "a/missing"), "deleting a missing key is not an error")

	require.NoError(t, s.PutIfAbsent(ctx, "m/one", []byte("first")))
	assert.ErrorIs(t, s.PutIfAbsent(ctx, "m/one", []byte("second")), ErrExists)
	rc, err = s.Get(ctx, "m/one")
	require.NoError(t, err)
	got, _ = io.ReadAll(rc)
	rc.Close()
	assert.Equal(t, "first", string(got), "the first writer's manifest stays")

	many := 1100 // more than one ListObjectsV2 page
	for i := range many {
		require.NoError(t, s.Put(ctx, "p/"+string(rune('a'+i%26))+"/"+itoa(i), bytes.NewReader(nil), 0))
	}
	objs, err = s.List(ctx, "p/")
	require.NoError(t, err)
	assert.Len(t, objs, many, "a listing pages through every key")

	bad := cfg
	bad.SecretKey = "wrong"
	wrong, err := NewS3Store(bad)
	require.NoError(t, err)
	assert.ErrorContains(t, wrong.Check(ctx), "the credentials are refused")
	_, err = wrong.List(ctx, "a/")
	assert.Error(t, err, "a refused listing is an error, never an empty one")
	missing := cfg
	missing.Bucket = "nope"
	nb, err := NewS3Store(missing)
	require.NoError(t, err)
	assert.ErrorContains(t, nb.Check(ctx), "does not exist")
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestParseS3URL(t *testing.T) {
	for _, tc := range []struct{ url, bucket, region, prefix, err string }{
		{url: "s3://backups@us-east-1/cluster-a", bucket: "backups", region: "us-east-1", prefix: "cluster-a"},
		{url: "s3://backups@eu-west-3/", bucket: "backups", region: "eu-west-3"},
		{url: "s3://backups@eu-west-3", bucket: "backups", region: "eu-west-3"},
		{url: "s3://backups/x", err: "the bucket and the region are required"},
		{url: "file:///x", err: "is not an s3://"},
	} {
		b, r, p, err := ParseS3URL(tc.url)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.url)
			continue
		}
		require.NoError(t, err, tc.url)
		assert.Equal(t, []string{tc.bucket, tc.region, tc.prefix}, []string{b, r, p}, tc.url)
	}
}

// A backup and an incremental through the real S3 server restore byte
// equal; the server killed in the middle of an upload fails that backup,
// which is then not listed, and once the server is back the same backup
// succeeds and GC keeps what it references.
func TestS3BackupRestoreAndServerCrash(t *testing.T) {
	ctx := context.Background()
	srv, cfg := startS3(t)
	s, err := NewS3Store(cfg)
	require.NoError(t, err)
	tgt, err := Open(ctx, s, Options{ChunkSize: testChunk, PackSize: 4 * testChunk})
	require.NoError(t, err)
	size := int64(64 * testChunk)
	data := volume(7, size)
	m1, err := tgt.Backup(ctx, BackupInput{Volume: "v1", Backup: "b1", Snapshot: "s1", Size: size, Source: bytes.NewReader(data)})
	require.NoError(t, err)
	got, err := restore(t, tgt, m1, nil, RestoreOptions{})
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "restored through S3")

	changed := append([]byte(nil), data...)
	copy(changed[5*testChunk:], bytes.Repeat([]byte{7}, 3*testChunk))
	var once sync.Once
	_, err = tgt.Backup(ctx, BackupInput{Volume: "v1", Backup: "b2", Snapshot: "s2", Size: size, Source: bytes.NewReader(changed),
		Base: m1, Changed: []Range{{Offset: 5 * testChunk, Length: 3 * testChunk}},
		Progress: func(done, total int64) {
			if done > 0 {
				once.Do(func() { require.NoError(t, srv.Stop()) })
			}
		}})
	require.Error(t, err, "the server died during the backup")
	require.NoError(t, srv.Restart())
	list, err := tgt.ListBackups(ctx)
	require.NoError(t, err)
	for _, h := range list {
		assert.NotEqual(t, "b2", h.Backup, "a failed backup is never listed")
	}
	m2, err := tgt.Backup(ctx, BackupInput{Volume: "v1", Backup: "b2", Snapshot: "s2", Size: size, Source: bytes.NewReader(changed),
		Base: m1, Changed: []Range{{Offset: 5 * testChunk, Length: 3 * testChunk}}})
	require.NoError(t, err)
	got, err = restore(t, tgt, m2, nil, RestoreOptions{})
	require.NoError(t, err)
	require.True(t, bytes.Equal(changed, got), "the retried incremental restores the new data")
	report, err := tgt.Verify(ctx, m2, 4)
	require.NoError(t, err)
	assert.Empty(t, report.Bad)
	assert.Positive(t, report.Chunks)
}
