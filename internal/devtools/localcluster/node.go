package localcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// NodeOptions configures StartNodes.
type NodeOptions struct {
	// Names are the nodes' names, each a distinct loopback address
	// (127.0.0.1, 127.0.0.2, …): the kubelet binds it and reports it as the
	// Node's InternalIP, so several kubelets share one machine without port
	// clashes and the API server reaches each for logs and exec.
	Names []string
	// ImageTars are image tarballs (package/images builds them) imported into
	// every node's containerd before its kubelet starts: there is no
	// registry. images.PauseRef, the Pods' sandbox image, must be among them.
	ImageTars []string
}

// Node is one real kubelet node: its own containerd (root, state, socket,
// runc state), kubelet (root, certificates, ports) and cgroup subtree, all
// under Dir so that teardown knows exactly what is its own.
type Node struct {
	Name        string // also its InternalIP
	Dir         string
	KubeletPort int

	cluster    *Cluster
	cgroupRoot string // e.g. /strata-1a2b3c4d-127-0-0-2
	healthPort int
	containerd *Process
	kubelet    *Process
	log        logrus.FieldLogger
}

const (
	nodeReadyTimeout    = 2 * time.Minute
	containerdUpTimeout = time.Minute
	kubeletStopTimeout  = 10 * time.Second
	// Short: containerd refuses socket paths over 104 bytes (its ttrpc
	// socket is this one plus ".ttrpc"), and the node directory may be deep.
	containerdSocketName = "ctrd.sock"
	maxSocketPath        = 104
)

// kubeletNodesDir holds a directory per kubelet node, apart from the
// process nodes' directories (<run>/nodes/node-N) of the managers.
const kubeletNodesDir = "kubelets"

// DefaultNodeNames are the loopback addresses `make run` and the tests use.
var DefaultNodeNames = []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}

// StartNodes starts a kubelet node per name and returns once every Node is
// Ready. Leftovers of an earlier run in the same directory (a test binary
// killed with -9, say) are torn down first. On error the nodes it started are
// torn down again.
func (c *Cluster) StartNodes(ctx context.Context, opts NodeOptions) ([]*Node, error) {
	if len(opts.Names) == 0 {
		return nil, errors.New("StartNodes: no node names")
	}
	for _, name := range []string{"kubelet", "containerd", "containerd-shim-runc-v2", "ctr"} {
		if _, err := os.Stat(filepath.Join(c.BinDir, name)); err != nil {
			return nil, fmt.Errorf("node binary: %w (scripts/build-tools.sh builds it)", err)
		}
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, fmt.Errorf("runc: %w (apt-get install runc)", err)
	}
	if err := c.checkNodeNames(opts.Names); err != nil {
		return nil, err
	}
	started := time.Now()
	var nodes []*Node
	for _, name := range opts.Names {
		n := c.newNode(name)
		if err := n.teardown(); err != nil {
			return nil, fmt.Errorf("node %s: cleaning up an earlier run: %w", name, err)
		}
		c.nodes = append(c.nodes, n)
		nodes = append(nodes, n)
		if err := n.start(ctx, opts.ImageTars); err != nil {
			_ = c.StopNodes()
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
	}
	kubeletsStarted := time.Now()
	if err := c.waitNodesReady(ctx, opts.Names); err != nil {
		_ = c.StopNodes()
		return nil, err
	}
	c.log.WithFields(logrus.Fields{"nodes": opts.Names, "took": time.Since(started).Round(time.Millisecond),
		"lastKubeletToReady": time.Since(kubeletsStarted).Round(time.Millisecond)}).Info("kubelet nodes are Ready")
	return nodes, nil
}

// checkNodeNames refuses, before anything starts, a name that is not a
// loopback address, one given twice or already running, and a cluster
// directory too deep for the nodes' unix sockets.
func (c *Cluster) checkNodeNames(names []string) error {
	seen := map[string]bool{}
	for _, n := range c.nodes {
		seen[n.Name] = true
	}
	for _, name := range names {
		if ip := net.ParseIP(name); ip == nil || !ip.IsLoopback() || ip.To4() == nil {
			return fmt.Errorf("node name %q: must be an IPv4 loopback address such as 127.0.0.2", name)
		}
		if seen[name] {
			return fmt.Errorf("node name %q: given twice or already started", name)
		}
		seen[name] = true
		if longest := c.newNode(name).ContainerdSocket() + ".ttrpc"; len(longest) > maxSocketPath {
			return fmt.Errorf("node %s: socket path %s is %d bytes, over the %d a unix socket may have: use a shorter cluster directory",
				name, longest, len(longest), maxSocketPath)
		}
	}
	return nil
}

// Nodes returns the kubelet nodes StartNodes started.
func (c *Cluster) Nodes() []*Node { return append([]*Node(nil), c.nodes...) }

// StopNodes tears every kubelet node down: kubelet, containerd, shims and
// containers stopped; mounts under the node directories, the nodes' cgroups,
// loop devices on their files and kubelet's log links removed; kernel settings
// kubelet changed put back. It is safe to call more than once.
func (c *Cluster) StopNodes() error {
	var errs []error
	for i := len(c.nodes) - 1; i >= 0; i-- {
		if err := c.nodes[i].teardown(); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", c.nodes[i].Name, err))
		}
	}
	c.nodes = nil
	return errors.Join(append(errs, c.restoreKernelTunables())...)
}

// TeardownNodes tears down the kubelet nodes a cluster in dir left behind
// (a run killed before it could clean up): their Pods, mounts and cgroups.
// Call it before removing dir: a recursive delete would descend into mounts.
// A nil log means logrus' standard logger.
func TeardownNodes(dir string, log logrus.FieldLogger) error {
	if log == nil {
		log = logrus.StandardLogger()
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	c := &Cluster{Dir: dir, log: log}
	entries, err := os.ReadDir(c.path(kubeletNodesDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() && net.ParseIP(e.Name()) != nil {
			errs = append(errs, c.newNode(e.Name()).teardown())
		}
	}
	return errors.Join(append(errs, c.restoreKernelTunables())...)
}

func (c *Cluster) newNode(name string) *Node {
	return &Node{Name: name, Dir: c.path(kubeletNodesDir, name), cluster: c,
		cgroupRoot: "/" + cgroupPrefix(c.Dir) + strings.ReplaceAll(name, ".", "-"),
		log:        c.log.WithField("node", name)}
}

// cgroupPrefix names the cgroups of the cluster in dir: unique per cluster
// directory, so parallel clusters never share cgroups, and stable, so a later
// run in the same directory finds an earlier one's.
func cgroupPrefix(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "strata-" + hex.EncodeToString(sum[:4]) + "-"
}

func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.Dir}, elem...)...)
}

// ContainerdSocket is the node's containerd endpoint (for ctr and CRI clients).
func (n *Node) ContainerdSocket() string { return n.path(containerdSocketName) }

// KubeletRoot is the kubelet's --root-dir: pods, volumes, plugins, plugin
// registration sockets.
func (n *Node) KubeletRoot() string { return n.path("kubelet") }

// Kubelet is the running kubelet process (nil before start).
func (n *Node) Kubelet() *Process { return n.kubelet }

// Containerd is the running containerd process.
func (n *Node) Containerd() *Process { return n.containerd }

func (n *Node) start(ctx context.Context, imageTars []string) error {
	for _, d := range []string{"containerd", "runc", "cni-bin", "cni-conf", "kubelet", "pod-logs",
		"static-pods", "volume-plugins", "pki", "logs"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := n.cluster.saveKernelTunables(); err != nil {
		return err
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	if err := n.writeCNI(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	imported := time.Now()
	if err := n.importImages(ctx, imageTars); err != nil {
		return err
	}
	n.log.WithFields(logrus.Fields{"images": len(imageTars), "took": time.Since(imported).Round(time.Millisecond)}).
		Info("images imported into containerd")
	if err := n.writeKubeletFiles(); err != nil {
		return err
	}
	return n.StartKubelet()
}

func (n *Node) startContainerd(ctx context.Context) error {
	cfg := n.path("containerd", "config.toml")
	if err := os.WriteFile(cfg, []byte(n.containerdConfig()), 0o644); err != nil {
		return err
	}
	p, err := StartProcess("containerd-"+n.Name, n.path("logs", "containerd.log"),
		filepath.Join(n.cluster.BinDir, "containerd"), "--config", cfg)
	if err != nil {
		return err
	}
	n.containerd = p
	return n.cluster.waitForProcess(ctx, p, "containerd "+n.Name, containerdUpTimeout, func(ctx context.Context) error {
		return n.ctr(ctx, "version")
	})
}

// importImages loads the image tarballs with ctr, as `kind load` does; the
// CRI plugin sees images in the k8s.io namespace.
// ImportImages imports image tarballs into every node's containerd (a new
// image for helm upgrade, say).
func (c *Cluster) ImportImages(ctx context.Context, tars []string) error {
	for _, n := range c.nodes {
		if err := n.importImages(ctx, tars); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

func (n *Node) importImages(ctx context.Context, tars []string) error {
	for _, tar := range tars {
		if err := n.ctr(ctx, "-n", "k8s.io", "images", "import", "--digests", tar); err != nil {
			return fmt.Errorf("importing %s: %w", tar, err)
		}
	}
	return nil
}

func (n *Node) ctr(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(n.cluster.BinDir, "ctr"),
		append([]string{"--address", n.ContainerdSocket()}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// StartKubelet starts (or restarts, after KillKubelet) the node's kubelet.
func (n *Node) StartKubelet() error {
	if n.kubelet != nil && !n.kubelet.Exited() {
		return fmt.Errorf("kubelet on %s is running (pid %d)", n.Name, n.kubelet.Pid())
	}
	p, err := StartProcess("kubelet-"+n.Name, n.path("logs", "kubelet.log"),
		filepath.Join(n.cluster.BinDir, "kubelet"),
		"--config="+n.path("kubelet-config.yaml"),
		"--kubeconfig="+n.path("kubelet.kubeconfig"),
		"--root-dir="+n.KubeletRoot(),
		"--cert-dir="+n.path("pki"),
		// A loopback --node-ip is refused; an IP as the hostname is taken as
		// the node's address instead.
		"--hostname-override="+n.Name,
		"--v=1",
	)
	if err != nil {
		return err
	}
	n.kubelet = p
	n.log.WithFields(logrus.Fields{"pid": p.Pid(), "log": p.LogPath, "port": n.KubeletPort}).Debug("kubelet started")
	return nil
}

// KillKubelet ends the kubelet with SIGKILL, as a crash would; containerd and
// the Pods keep running.
func (n *Node) KillKubelet() error {
	if n.kubelet == nil {
		return errors.New("kubelet not started")
	}
	return n.kubelet.Kill()
}

// WaitReady waits until this kubelet serves (healthz and its API port, so
// logs and exec reach it) and the Node reports Ready=True. After a restart the
// Node's Ready condition is still the old kubelet's, so it alone says little.
func (n *Node) WaitReady(ctx context.Context) error {
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", n.healthPort)
	serving := net.JoinHostPort(n.Name, strconv.Itoa(n.KubeletPort))
	if err := n.cluster.waitForProcess(ctx, n.kubelet, "kubelet "+n.Name+" serving", nodeReadyTimeout,
		func(ctx context.Context) error {
			if err := httpOK(ctx, healthz); err != nil {
				return err
			}
			conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", serving)
			if err != nil {
				return err
			}
			return conn.Close()
		}); err != nil {
		return err
	}
	return n.cluster.waitNodesReady(ctx, []string{n.Name})
}

func (c *Cluster) waitNodesReady(ctx context.Context, names []string) error {
	cs, err := kubernetes.NewForConfig(c.AdminConfig)
	if err != nil {
		return err
	}
	return c.waitFor(ctx, fmt.Sprintf("nodes %v Ready", names), nodeReadyTimeout, func(ctx context.Context) error {
		for _, n := range c.nodes {
			if n.kubelet != nil && n.kubelet.Exited() {
				return fmt.Errorf("kubelet on %s exited (%v); last lines of %s:\n%s",
					n.Name, n.kubelet.Err(), n.kubelet.LogPath, n.kubelet.LogTail(20))
			}
		}
		for _, name := range names {
			node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !NodeReady(node) {
				return fmt.Errorf("node %s is not Ready yet", name)
			}
		}
		return nil
	})
}

// NodeReady reports whether the Node's Ready condition is True.
func NodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// writeKubeletFiles issues the kubelet's client certificate (user
// system:node:<name>, group system:nodes, what the Node authorizer expects)
// and serving certificate, and writes its kubeconfig and configuration.
func (n *Node) writeKubeletFiles() error {
	ca := n.cluster.ca
	clientCert, clientKey, err := ca.issue(n.path("pki", "kubelet-client"), certRequest{
		CommonName: "system:node:" + n.Name, Groups: []string{"system:nodes"}})
	if err != nil {
		return err
	}
	if _, _, err := ca.issue(n.path("pki", "kubelet"), certRequest{
		CommonName: n.Name, IPs: []net.IP{net.ParseIP(n.Name)}, Server: true}); err != nil {
		return err
	}
	if err := os.WriteFile(n.path("pki", "ca.crt"), ca.CertPEM, 0o644); err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: n.cluster.APIServerURL, CertificateAuthorityData: n.cluster.CAData}
	cfg.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{ClientCertificateData: clientCert, ClientKeyData: clientKey}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "kubelet"}
	cfg.CurrentContext = "local"
	if err := clientcmd.WriteToFile(*cfg, n.path("kubelet.kubeconfig")); err != nil {
		return err
	}
	ports, err := FreePorts(2)
	if err != nil {
		return err
	}
	n.KubeletPort, n.healthPort = ports[0], ports[1]
	data, err := n.kubeletConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(n.path("kubelet-config.yaml"), data, 0o644)
}
