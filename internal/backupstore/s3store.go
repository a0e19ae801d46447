package backupstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config is where an s3:// target lives and how to reach it.
type S3Config struct {
	// Endpoint is the server, as a URL (https://s3.example.com,
	// http://127.0.0.1:7070) or host[:port] (https).
	Endpoint string
	Bucket   string
	Region   string
	// Prefix is the folder of the target in the bucket; "" is the bucket's root.
	Prefix               string
	AccessKey, SecretKey string
	// Transport overrides the HTTP transport (a custom CA, for example).
	Transport http.RoundTripper
}

// ParseS3URL reads a target URL of the form s3://<bucket>@<region>/<prefix>.
func ParseS3URL(raw string) (bucket, region, prefix string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" {
		return "", "", "", fmt.Errorf("%q is not an s3://<bucket>@<region>/<prefix> URL", raw)
	}
	if u.User == nil || u.User.Username() == "" || u.Host == "" {
		return "", "", "", fmt.Errorf("%q: want s3://<bucket>@<region>/<prefix>: the bucket and the region are required", raw)
	}
	return u.User.Username(), u.Host, strings.Trim(u.Path, "/"), nil
}

// S3Store is an ObjectStore on an S3-compatible server, through minio-go:
// it speaks plain S3 (and so versitygw, MinIO, Ceph RGW, AWS) without the
// checksum headers newer AWS SDKs send and some servers refuse.
type S3Store struct {
	client *minio.Client
	bucket string
	prefix string // "" or ending in '/'
}

// NewS3Store connects to cfg's server; it makes no request.
func NewS3Store(cfg S3Config) (*S3Store, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("s3 target: bucket is required")
	}
	host, secure, err := s3Endpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	client, err := minio.New(host, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: secure, Region: cfg.Region, Transport: cfg.Transport,
		// Path-style requests: every S3-compatible server takes them, and a
		// bucket name need not be a DNS name.
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 target %s: %w", cfg.Endpoint, err)
	}
	prefix := strings.Trim(cfg.Prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	return &S3Store{client: client, bucket: cfg.Bucket, prefix: prefix}, nil
}

func s3Endpoint(endpoint string) (host string, secure bool, err error) {
	if endpoint == "" {
		return "", false, errors.New("s3 target: endpoint is required")
	}
	if !strings.Contains(endpoint, "://") {
		return endpoint, true, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") {
		return "", false, fmt.Errorf("s3 endpoint %q: want http(s)://host[:port]", endpoint)
	}
	return u.Host, u.Scheme == "https", nil
}

// Check tells whether the bucket can be reached with these credentials,
// with an error an admin can act on.
func (s *S3Store) Check(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	switch {
	case err != nil:
		return fmt.Errorf("s3 bucket %s at %s: %w", s.bucket, s.client.EndpointURL(), describeS3Error(err))
	case !ok:
		return fmt.Errorf("s3 bucket %s at %s does not exist", s.bucket, s.client.EndpointURL())
	}
	return nil
}

// MakeBucket creates the bucket if it does not exist (local clusters and
// tests; a real target's bucket is the admin's).
func (s *S3Store) MakeBucket(ctx context.Context) error {
	err := s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{})
	if code := minio.ToErrorResponse(err).Code; code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
		return nil
	}
	return err
}

func describeS3Error(err error) error {
	switch minio.ToErrorResponse(err).Code {
	case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied":
		return fmt.Errorf("the credentials are refused: %w", err)
	}
	return err
}

func (s *S3Store) key(key string) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// Put is one PUT: objects are at most a pack (tens of MiB), and a multipart
// upload would cost three or more requests for one.
func (s *S3Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	_, err = s.client.PutObject(ctx, s.bucket, k, r, size, minio.PutObjectOptions{DisableMultipart: true})
	return s.wrap("put", key, err)
}

// PutIfAbsent is a PUT with If-None-Match: *, which the server refuses
// (412) when the key exists: the manifest's atomic commit.
func (s *S3Store) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	opts := minio.PutObjectOptions{DisableMultipart: true}
	opts.SetMatchETagExcept("*")
	_, err = s.client.PutObject(ctx, s.bucket, k, bytes.NewReader(data), int64(len(data)), opts)
	if resp := minio.ToErrorResponse(err); err != nil &&
		(resp.StatusCode == http.StatusPreconditionFailed || resp.Code == "PreconditionFailed") {
		return fmt.Errorf("put %s: %w", key, ErrExists)
	}
	return s.wrap("put", key, err)
}

func (s *S3Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.get(ctx, key, minio.GetObjectOptions{})
}

func (s *S3Store) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	var opts minio.GetObjectOptions
	if n <= 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	if err := opts.SetRange(off, off+n-1); err != nil {
		return nil, err
	}
	return s.get(ctx, key, opts)
}

// get opens the object and makes the first request at once, so a missing
// key is ErrNotFound here rather than at the first Read.
func (s *S3Store) get(ctx context.Context, key string, opts minio.GetObjectOptions) (io.ReadCloser, error) {
	k, err := s.key(key)
	if err != nil {
		return nil, err
	}
	// Core's GetObject is one GET that reports a missing object at once;
	// Client.GetObject defers the request and Stat on it costs a HEAD more
	// per object (twice the requests of a restore).
	body, _, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, k, opts)
	if err != nil {
		return nil, s.wrap("get", key, err)
	}
	return body, nil
}

func (s *S3Store) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	k, err := s.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	info, err := s.client.StatObject(ctx, s.bucket, k, minio.StatObjectOptions{})
	if err != nil {
		return ObjectInfo{}, s.wrap("stat", key, err)
	}
	return ObjectInfo{Key: key, Size: info.Size, ModTime: info.LastModified}, nil
}

// List pages through ListObjectsV2 (1000 keys a request). An error at any
// page fails the whole listing: a partial listing must never pass for a
// complete one.
func (s *S3Store) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	for obj := range s.client.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, s.wrap("list", prefix, obj.Err)
		}
		out = append(out, ObjectInfo{Key: strings.TrimPrefix(obj.Key, s.prefix), Size: obj.Size, ModTime: obj.LastModified})
	}
	return out, nil
}

func (s *S3Store) Delete(ctx context.Context, key string) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	return s.wrap("delete", key, s.client.RemoveObject(ctx, s.bucket, k, minio.RemoveObjectOptions{}))
}

// wrap maps S3's not-found answers to ErrNotFound and names the call.
func (s *S3Store) wrap(verb, key string, err error) error {
	if err == nil {
		return nil
	}
	resp := minio.ToErrorResponse(err)
	if resp.Code == "NoSuchKey" || (resp.StatusCode == http.StatusNotFound && resp.Code != "NoSuchBucket") {
		return fmt.Errorf("%s %s: %w", verb, key, ErrNotFound)
	}
	return fmt.Errorf("%s %s in s3 bucket %s: %w", verb, key, s.bucket, describeS3Error(err))
}
