package backupstore

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
)

// Keys of a backup target's credential Secret (as Longhorn's, so an
// existing Secret works unchanged).
const (
	SecretAccessKey = "AWS_ACCESS_KEY_ID"
	SecretSecretKey = "AWS_SECRET_ACCESS_KEY"
	SecretEndpoint  = "AWS_ENDPOINTS"
)

// StoreFor returns the store a target URL names: file:///<dir> (a
// directory, typically an NFS mount present on every node) or
// s3://<bucket>@<region>/<prefix>, whose endpoint and keys come from the
// credential Secret's data. Errors name what is wrong in the admin's terms.
func StoreFor(targetURL string, secret map[string][]byte) (ObjectStore, error) {
	u, err := url.Parse(targetURL)
	if err != nil {
		return nil, fmt.Errorf("backup target URL %q: %w", targetURL, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || !filepath.IsAbs(u.Path) {
			return nil, fmt.Errorf("backup target URL %q: want file:///<absolute directory>", targetURL)
		}
		return NewFileStore(filepath.Clean(u.Path))
	case "s3":
		bucket, region, prefix, err := ParseS3URL(targetURL)
		if err != nil {
			return nil, err
		}
		cfg := S3Config{Bucket: bucket, Region: region, Prefix: prefix,
			AccessKey: string(secret[SecretAccessKey]), SecretKey: string(secret[SecretSecretKey]),
			Endpoint: strings.TrimSpace(string(secret[SecretEndpoint]))}
		for _, key := range []string{SecretEndpoint, SecretAccessKey, SecretSecretKey} {
			if strings.TrimSpace(string(secret[key])) == "" {
				return nil, fmt.Errorf("backup target %s: the credential Secret has no %s", targetURL, key)
			}
		}
		return NewS3Store(cfg)
	}
	return nil, fmt.Errorf("backup target URL %q: the scheme must be s3:// or file://", targetURL)
}
