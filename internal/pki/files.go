package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/strata-storage/strata/internal/atomicfile"
)

// A TLS directory holds what a component that cannot read Secrets (the
// instance manager) presents and trusts; its manager writes it.
const (
	// IdentityFile holds the certificate and its key in one file, so that
	// a reader never pairs a new certificate with an old key.
	IdentityFile = "identity.pem"
	// BundleFile holds the CA certificates to trust.
	BundleFile = "ca-bundle.crt"
)

// WriteDir writes an identity and the CA bundle into dir (0700, files
// 0600), each file atomically.
func WriteDir(dir string, cert *IssuedCert, bundle []*x509.Certificate) error {
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	ident, err := identityPEM(cert)
	if err != nil {
		return err
	}
	// The bundle first: a new certificate is only presented once peers'
	// bundles (written by their managers from the same Secret) and ours
	// hold its CA.
	if err := atomicfile.WriteFile(filepath.Join(dir, BundleFile), bundlePEM(bundle)); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, IdentityFile), ident)
}

func identityPEM(cert *IssuedCert) ([]byte, error) {
	var b bytes.Buffer
	for _, der := range cert.TLS.Certificate {
		b.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	}
	der, err := x509.MarshalPKCS8PrivateKey(cert.TLS.PrivateKey)
	if err != nil {
		return nil, err
	}
	b.Write(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	return b.Bytes(), nil
}

func bundlePEM(bundle []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range bundle {
		b.Write(CertPEM(c))
	}
	return b.Bytes()
}

// ReadDir reads what WriteDir wrote: the identity and the bundle.
func ReadDir(dir string) (*tls.Certificate, []*x509.Certificate, error) {
	ident, err := os.ReadFile(filepath.Join(dir, IdentityFile))
	if err != nil {
		return nil, nil, err
	}
	cert, err := tls.X509KeyPair(ident, ident)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", filepath.Join(dir, IdentityFile), err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, nil, err
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, BundleFile))
	if err != nil {
		return nil, nil, err
	}
	bundle, err := ParseCerts(data)
	if err == nil && len(bundle) == 0 {
		err = errors.New("no certificate")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", filepath.Join(dir, BundleFile), err)
	}
	return &cert, bundle, nil
}

// DirSource is a Source over a TLS directory. It re-reads the files when
// they change (checked at most once a second, so a handshake storm does
// not turn into a stat storm), so a renewal reaches new connections
// without a restart.
type DirSource struct {
	dir string
	now func() time.Time

	mu        sync.Mutex
	checkedAt time.Time
	stamp     [2]fileStamp
	cert      *tls.Certificate
	roots     *x509.CertPool
	err       error
}

type fileStamp struct {
	ino   uint64
	mtime time.Time
	size  int64
}

// NewDirSource reads dir on first use.
func NewDirSource(dir string) *DirSource { return &DirSource{dir: dir, now: time.Now} }

// Dir is the directory read.
func (d *DirSource) Dir() string { return d.dir }

// Certificate implements Source.
func (d *DirSource) Certificate() (*tls.Certificate, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reloadLocked()
	return d.cert, d.err
}

// Roots implements Source.
func (d *DirSource) Roots() (*x509.CertPool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reloadLocked()
	return d.roots, d.err
}

func (d *DirSource) reloadLocked() {
	now := d.now()
	if d.cert != nil && now.Sub(d.checkedAt) < time.Second {
		return
	}
	d.checkedAt = now
	var stamp [2]fileStamp
	for i, name := range []string{IdentityFile, BundleFile} {
		fi, err := os.Stat(filepath.Join(d.dir, name))
		if err != nil {
			d.fail(fmt.Errorf("TLS directory %s: %w (its manager writes it once it has read the CA)", d.dir, err))
			return
		}
		stamp[i] = fileStamp{mtime: fi.ModTime(), size: fi.Size()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			stamp[i].ino = st.Ino
		}
	}
	if d.cert != nil && stamp == d.stamp {
		return
	}
	cert, bundle, err := ReadDir(d.dir)
	if err != nil {
		d.fail(err)
		return
	}
	pool := x509.NewCertPool()
	for _, c := range bundle {
		pool.AddCert(c)
	}
	d.stamp, d.cert, d.roots, d.err = stamp, cert, pool, nil
}

// fail keeps serving what was last read, if anything: a half-written or
// removed file must not cut off a node that had working certificates.
func (d *DirSource) fail(err error) {
	if d.cert == nil {
		d.err = err
	}
}
