package nbd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
)

// These tests drive the server with unmodified external clients: libnbd's
// nbdinfo and nbdcopy, and qemu's qemu-io and qemu-img. A missing tool is a
// failure, not a skip.

const extSize = 32 << 20

// requireTool returns the path of an external client or fails the test
// naming the Debian package that provides it.
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found in PATH: install the Debian package %s (apt-get install -y %s)", name, pkg, pkg)
	}
	return p
}

// runTool runs an external client with a timeout and returns its combined
// output and error.
func runTool(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s timed out: %w", name, ctx.Err())
	}
	t.Logf("$ %s %s\n%s", name, strings.Join(args, " "), out)
	return string(out), err
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := runTool(t, name, args...)
	require.NoError(t, err, "%s %v failed:\n%s", name, args, out)
	return out
}

// countingListener records the largest number of simultaneously open
// connections.
type countingListener struct {
	net.Listener
	open, peak atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	n := l.open.Add(1)
	for {
		p := l.peak.Load()
		if n <= p || l.peak.CompareAndSwap(p, n) {
			break
		}
	}
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

type extFixture struct {
	dir     string
	file    *blockdev.File
	dev     *countingDev
	tcp     *countingListener
	unix    *countingListener
	sock    string
	tcpAddr string
}

// transport is how a client reaches the export in the URI syntaxes the
// tools accept.
type transport struct {
	name    string
	nbdURI  string // libnbd and qemu URI
	qemuAlt string // qemu's legacy nbd: syntax
	peak    func() int64
}

func newExtFixture(t *testing.T) (*extFixture, []transport) {
	t.Helper()
	// Short directory: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "nbdext")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &extFixture{dir: dir, sock: filepath.Join(dir, "nbd.sock")}
	f.file, err = blockdev.OpenFile(filepath.Join(dir, "disk.raw"), extSize)
	require.NoError(t, err)
	t.Cleanup(func() { f.file.Close() })
	f.dev = &countingDev{Device: f.file}

	logger, _ := logtest.NewNullLogger()
	srv := NewServer(Options{Logger: logger})
	require.NoError(t, srv.AddExport("disk", f.dev, Description("external client test")))
	require.NoError(t, srv.AddExport("other", blockdev.NewMem(1<<20)))
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ul, err := net.Listen("unix", f.sock)
	require.NoError(t, err)
	f.tcp, f.unix = &countingListener{Listener: tl}, &countingListener{Listener: ul}
	f.tcpAddr = tl.Addr().String()
	var wg sync.WaitGroup
	for _, l := range []net.Listener{f.tcp, f.unix} {
		wg.Go(func() { assert.ErrorIs(t, srv.Serve(l), ErrServerClosed) })
	}
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		wg.Wait()
	})
	host, port, _ := net.SplitHostPort(f.tcpAddr)
	return f, []transport{
		{
			name:    "tcp",
			nbdURI:  fmt.Sprintf("nbd://%s/disk", f.tcpAddr),
			qemuAlt: fmt.Sprintf("nbd:%s:%s:exportname=disk", host, port),
			peak:    func() int64 { return f.tcp.peak.Load() },
		},
		{
			name:    "unix",
			nbdURI:  fmt.Sprintf("nbd+unix:///disk?socket=%s", f.sock),
			qemuAlt: fmt.Sprintf("nbd:unix:%s:exportname=disk", f.sock),
			peak:    func() int64 { return f.unix.peak.Load() },
		},
	}
}

func (f *extFixture) deviceBytes(t *testing.T, off, n int64) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := f.file.ReadAt(b, off)
	require.NoError(t, err)
	return b
}

// randomImage writes a size-byte file of random data with a zero run in the
// middle (so nbdcopy sends WRITE_ZEROES for it) and returns its path.
func randomImage(t *testing.T, dir, name string, seed uint64) string {
	t.Helper()
	b := make([]byte, extSize)
	_, _ = rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	clear(b[8<<20 : 12<<20])
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func sha(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return sha256.Sum256(b)
}

func TestExternalNbdinfo(t *testing.T) {
	requireTool(t, "nbdinfo", "libnbd-bin")
	f, transports := newExtFixture(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			out := mustRun(t, "nbdinfo", "--size", tr.nbdURI)
			assert.Equal(t, strconv.Itoa(extSize), strings.TrimSpace(out))
			out = mustRun(t, "nbdinfo", tr.nbdURI)
			assert.Regexp(t, `export-size:\s+33554432\b`, out)
			for _, cap := range []string{"can_flush: true", "can_fua: true", "can_trim: true", "can_zero: true", "can_multi_conn: true", "is_read_only: false"} {
				assert.Contains(t, out, cap)
			}
			assert.Regexp(t, `block_size_maximum:\s+33554432\b`, out)
			assert.Regexp(t, `block_size_preferred:\s+4096\b`, out)
			assert.Contains(t, out, "external client test", "the export description")

			// An unknown export is reported as such.
			bad := strings.Replace(tr.nbdURI, "/disk", "/missing", 1)
			out, err := runTool(t, "nbdinfo", bad)
			require.Error(t, err)
			// libnbd renders NBD_REP_ERR_UNKNOWN as ENOENT.
			assert.Contains(t, out, "No such file or directory for export: missing")
		})
	}
	// NBD_OPT_LIST.
	out := mustRun(t, "nbdinfo", "--list", "nbd://"+f.tcpAddr)
	assert.Contains(t, out, `export="disk"`)
	assert.Contains(t, out, `export="other"`)
	assert.Regexp(t, `export-size:\s+1048576\b`, out)
}

func TestExternalQemuIO(t *testing.T) {
	requireTool(t, "qemu-io", "qemu-utils")
	f, transports := newExtFixture(t)
	for i, tr := range transports {
		for j, uri := range []string{tr.nbdURI, tr.qemuAlt} {
			t.Run(fmt.Sprintf("%s/%d", tr.name, j), func(t *testing.T) {
				base := int64(i*2+j) * (4 << 20)
				c := func(format string, args ...any) []string {
					return []string{"-c", fmt.Sprintf(format, args...)}
				}
				var args []string
				args = append(args, "-f", "raw", "-d", "unmap")
				args = append(args, c("write -P 0xab %d 1M", base)...)
				args = append(args, c("read -P 0xab %d 1M", base)...)
				args = append(args, c("write -P 0xcd %d 1M", base+(1<<20))...)
				args = append(args, c("write -z %d 64k", base+(1<<20))...)
				args = append(args, c("write -z -u %d 64k", base+(1<<20)+(64<<10))...)
				args = append(args, c("read -P 0 %d 128k", base+(1<<20))...)
				args = append(args, c("read -P 0xcd %d 896k", base+(1<<20)+(128<<10))...)
				args = append(args, c("write -P 0xef %d 1M", base+(2<<20))...)
				args = append(args, c("discard %d 1M", base+(2<<20))...)
				args = append(args, c("write -P 0x11 -f %d 4k", base+(3<<20))...)
				args = append(args, c("flush")...)
				args = append(args, uri)
				f0, u0, z0, _ := f.dev.counts()
				out := mustRun(t, "qemu-io", args...)
				assert.NotContains(t, out, "Pattern verification failed")
				assert.NotContains(t, out, "error")
				assert.Equal(t, 3, strings.Count(out, "read "), "each read reports")
				assert.Contains(t, out, "wrote 1048576/1048576 bytes")
				assert.Contains(t, out, "discard 1048576/1048576 bytes")

				// The device holds what qemu wrote.
				assert.Equal(t, bytes.Repeat([]byte{0xab}, 1<<20), f.deviceBytes(t, base, 1<<20))
				assert.Equal(t, make([]byte, 128<<10), f.deviceBytes(t, base+(1<<20), 128<<10))
				assert.Equal(t, bytes.Repeat([]byte{0xcd}, 896<<10), f.deviceBytes(t, base+(1<<20)+(128<<10), 896<<10))
				assert.Equal(t, bytes.Repeat([]byte{0x11}, 4096), f.deviceBytes(t, base+(3<<20), 4096))
				f1, u1, z1, _ := f.dev.counts()
				assert.Greater(t, u1, u0, "discard reached Device.Unmap")
				assert.Greater(t, z1, z0, "write -z -u reached Device.WriteZeroes")
				assert.GreaterOrEqual(t, f1, f0+2, "flush and FUA reached Device.Flush")

				// A wrong pattern is detected: this test can fail.
				out, _ = runTool(t, "qemu-io", "-f", "raw", "-c", fmt.Sprintf("read -P 0x99 %d 64k", base), uri)
				assert.Contains(t, out, "Pattern verification failed")
				// Out of range I/O is refused by the client or the server.
				out, _ = runTool(t, "qemu-io", "-f", "raw", "-c", fmt.Sprintf("read %d 64k", extSize-4096), uri)
				assert.NotContains(t, out, "read 65536/65536")
			})
		}
	}
}

func TestExternalNbdcopy(t *testing.T) {
	requireTool(t, "nbdcopy", "libnbd-bin")
	f, transports := newExtFixture(t)
	for i, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			src := randomImage(t, f.dir, "src-"+tr.name, uint64(i+1))
			_, _, z0, _ := f.dev.counts()
			mustRun(t, "nbdcopy", "--connections=4", "--flush", src, tr.nbdURI)
			want := sha(t, src)
			assert.Equal(t, want, sha256.Sum256(f.deviceBytes(t, 0, extSize)), "device content after nbdcopy in")
			_, _, z1, _ := f.dev.counts()
			assert.Greater(t, z1, z0, "the zero run was sent as WRITE_ZEROES")

			out := filepath.Join(f.dir, "out-"+tr.name)
			mustRun(t, "nbdcopy", "--connections=4", tr.nbdURI, out)
			assert.Equal(t, want, sha(t, out), "checksum after the round trip")
			assert.GreaterOrEqual(t, tr.peak(), int64(2), "nbdcopy used several connections at once")

			// The check can fail: a changed device byte changes the copy.
			_, err := f.file.WriteAt([]byte{0x42 ^ f.deviceBytes(t, 12345, 1)[0]}, 12345)
			require.NoError(t, err)
			mustRun(t, "nbdcopy", tr.nbdURI, out)
			assert.NotEqual(t, want, sha(t, out))
		})
	}
}

func TestExternalQemuImg(t *testing.T) {
	requireTool(t, "qemu-img", "qemu-utils")
	f, transports := newExtFixture(t)
	for i, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			out := mustRun(t, "qemu-img", "info", "--output=json", tr.nbdURI)
			var info struct {
				VirtualSize int64  `json:"virtual-size"`
				Format      string `json:"format"`
			}
			require.NoError(t, json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &info))
			assert.Equal(t, int64(extSize), info.VirtualSize)
			assert.Equal(t, "raw", info.Format)

			src := randomImage(t, f.dir, "img-"+tr.name, uint64(10+i))
			mustRun(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, tr.qemuAlt)
			assert.Equal(t, sha(t, src), sha256.Sum256(f.deviceBytes(t, 0, extSize)))
			out = mustRun(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", tr.nbdURI, src)
			assert.Contains(t, out, "Images are identical")

			dst := filepath.Join(f.dir, "img-out-"+tr.name)
			mustRun(t, "qemu-img", "convert", "-f", "raw", "-O", "raw", tr.nbdURI, dst)
			assert.Equal(t, sha(t, src), sha(t, dst))

			// compare notices a difference on the export.
			_, err := f.file.WriteAt([]byte{0xff ^ f.deviceBytes(t, 20<<20, 1)[0]}, 20<<20)
			require.NoError(t, err)
			out, err = runTool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", tr.nbdURI, src)
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "compare should fail: %v", err)
			assert.Equal(t, 1, ee.ExitCode())
			assert.Contains(t, out, "Content mismatch at offset 20971520")
		})
	}
}
