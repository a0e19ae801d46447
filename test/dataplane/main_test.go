// Package dataplane tests the data plane end to end: real instance-manager
// processes (one per simulated node), replicated volumes reached over gRPC
// through engineapi, and the unchanged external NBD clients (qemu-io,
// qemu-img, nbdcopy) as the only readers and writers of volume data.
package dataplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/internal/pki"
)

var env struct {
	bin  string
	root string
	pool *engineapi.Pool
	ca   *pki.Authority
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "strata-dataplane-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env.root = dir
	if env.bin, err = localcluster.ManagerBinary(context.Background(), dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The test plays every node's manager: one CA, a manager identity for
	// its calls, and an instance-manager identity written for each node.
	var manager *pki.MemorySource
	if env.ca, err = pki.NewAuthority(); err == nil {
		manager, err = env.ca.Source(pki.Identity{Component: pki.ComponentManager, Node: "test"})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env.pool = engineapi.NewPool(30*time.Second, pki.ClientConfig(manager, pki.ComponentInstanceManager))
	code := m.Run()
	env.pool.Close()
	if code == 0 {
		os.RemoveAll(dir)
	} else {
		fmt.Fprintln(os.Stderr, "logs kept in", dir)
	}
	os.Exit(code)
}

// sizeReportInterval is the instance managers' --size-report-interval:
// short, so tests see sizes published quickly.
const sizeReportInterval = 500 * time.Millisecond

// node is one simulated node's instance manager.
type node struct {
	name, stateDir, diskDir string
	fuseDir                 string // --fuse-dir, when set
	tlsDir                  string
	grpcAddr, nbdSocket     string
	proc                    *localcluster.Process
}

func startNode(t *testing.T, name string) *node {
	t.Helper()
	return startNodeWith(t, name, false)
}

// startNodeWith starts a node's instance manager, serving volumes as files
// too (--fuse-dir) when withFUSE.
func startNodeWith(t *testing.T, name string, withFUSE bool) *node {
	t.Helper()
	// A fresh directory per call, so -count=N and reruns never share state.
	base, err := os.MkdirTemp(env.root, strings.ReplaceAll(t.Name(), "/", "_")+"-"+name+"-")
	require.NoError(t, err)
	n := &node{name: name, stateDir: filepath.Join(base, "state"), diskDir: filepath.Join(base, "disk"), tlsDir: filepath.Join(base, "tls")}
	if withFUSE {
		n.fuseDir = filepath.Join(base, "fuse")
	}
	require.NoError(t, env.ca.WriteDir(n.tlsDir, pki.Identity{Component: pki.ComponentInstanceManager, Node: name}))
	ports, err := localcluster.FreePorts(1)
	require.NoError(t, err)
	n.grpcAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
	// Not under base, named after the test: a unix socket's path holds at
	// most 107 bytes.
	sockDir, err := os.MkdirTemp(env.root, "nbd-")
	require.NoError(t, err)
	n.nbdSocket = filepath.Join(sockDir, "nbd.sock")
	n.start(t)
	t.Cleanup(func() { _ = n.proc.Stop(10 * time.Second) })
	return n
}

// start (re)starts the node's instance-manager process with the same state.
func (n *node) start(t *testing.T) {
	t.Helper()
	args := []string{"instance-manager", "--listen", n.grpcAddr, "--nbd-socket", n.nbdSocket, "--state-dir", n.stateDir,
		"--tls-dir", n.tlsDir, "--disk-path", n.diskDir, "--size-report-interval", sizeReportInterval.String()}
	if n.fuseDir != "" {
		args = append(args, "--fuse-dir", n.fuseDir)
	}
	p, err := localcluster.StartProcess("instance-manager "+n.name, filepath.Join(filepath.Dir(n.stateDir), "im.log"),
		env.bin, args...)
	require.NoError(t, err)
	n.proc = p
	require.Eventually(t, func() bool {
		_, err := n.client(t).InstanceList(context.Background())
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "instance manager %s answers", n.name)
}

func (n *node) client(t *testing.T) *engineapi.Client {
	c, err := env.pool.Get(n.grpcAddr)
	require.NoError(t, err)
	return c
}

// tool runs an external client and fails the test with its output on error.
func tool(t *testing.T, name string, args ...string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	require.NoError(t, err, "%s is missing: apt-get install qemu-utils libnbd-bin", name)
	out, err := exec.Command(path, args...).CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	return string(out)
}

// qemuIO runs qemu-io commands against a target: an NBD URI or a raw file.
func qemuIO(t *testing.T, target string, cmds ...string) string {
	t.Helper()
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	return tool(t, "qemu-io", append(args, target)...)
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// expected builds a raw image by running the same qemu-io commands on a
// local file, so the volume is compared with what qemu itself produces.
func expected(t *testing.T, size int64, name string, cmds ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".img")
	tool(t, "qemu-img", "create", "-f", "raw", path, strconv.FormatInt(size, 10))
	if len(cmds) > 0 {
		qemuIO(t, path, cmds...)
	}
	return path
}

// readVolume copies the whole volume out with nbdcopy and returns its checksum.
func readVolume(t *testing.T, endpoint string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "copy.img")
	tool(t, "nbdcopy", endpoint, out)
	return sha256File(t, out)
}
