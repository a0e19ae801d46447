package localcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/strata-storage/strata/internal/unixsock"
)

// ManagerOptions are what every simulated node's strata-manager shares.
type ManagerOptions struct {
	Bin        string // strata-manager binary
	Kubeconfig string // the manager ServiceAccount's kubeconfig
	// NodeKubeconfig, when set, gives each node's manager its own
	// kubeconfig instead of Kubeconfig, called at every start (Restart
	// included): the manager ServiceAccount with a token bound to the
	// node's Node, which the CA signer requires of a certificate request
	// (Cluster.NodeKubeconfigs).
	NodeKubeconfig func(node string) (string, error)
	Namespace      string
	// RunDir holds nodes/<node>/disk-1 and logs/manager-<node>.log.
	RunDir        string
	LeaseDuration time.Duration
	// WithInstanceManager starts an instance manager for each node too, and
	// points the node's manager at it.
	WithInstanceManager bool
	// MaxRetryDelay is the managers' --max-retry-delay (0: their default).
	MaxRetryDelay time.Duration
	// InstanceManagerPods is the managers' --instance-manager-pods (the
	// rollout of instance managers that are Pods); empty: not set.
	InstanceManagerPods string
	// ExtraDiskPaths are more --disk-path directories for every instance
	// manager, beside its node's directory: benches that put the replicas
	// of all nodes under one directory.
	ExtraDiskPaths []string
	// FUSEFiles has each instance manager serve its volumes also as files
	// in FUSEDir (--fuse-dir), where the CSI node plugins put their loop
	// devices.
	FUSEFiles bool
}

// kubeconfig is node's manager's: NodeKubeconfig's if set, else Kubeconfig.
func (o ManagerOptions) kubeconfig(node string) (string, error) {
	if o.NodeKubeconfig == nil {
		return o.Kubeconfig, nil
	}
	path, err := o.NodeKubeconfig(node)
	if err != nil {
		return "", fmt.Errorf("kubeconfig of node %s's manager: %w", node, err)
	}
	return path, nil
}

// leaseDuration is the managers' --lease-duration.
func (o ManagerOptions) leaseDuration() time.Duration { return leaseOrDefault(o.LeaseDuration) }

// leaseOrDefault is d, or for 0 the default lease of the managers and the
// signer.
func leaseOrDefault(d time.Duration) time.Duration {
	if d == 0 {
		return 10 * time.Second
	}
	return d
}

// NodeDir is a simulated node's directory: its disks (disk-1, and any a
// test adds beside it) and its instance manager's state.
func (o ManagerOptions) NodeDir(node string) string { return filepath.Join(o.RunDir, "nodes", node) }

// NBDSocket is the unix socket a simulated node's instance manager serves
// its volumes on (--nbd-socket): apart from its disks, and short, since a
// unix socket's path holds at most 107 bytes.
func (o ManagerOptions) NBDSocket(node string) string {
	return filepath.Join(o.RunDir, "nbd", node+".sock")
}

// TLSDir is where a simulated node's manager writes its instance
// manager's certificate and the CA bundle (the manager's
// --instance-manager-tls-dir, the instance manager's --tls-dir): apart from
// its disks, as a hostPath beside them would be on a real node.
func (o ManagerOptions) TLSDir(node string) string { return filepath.Join(o.RunDir, "tls", node) }

// FUSEDir is where a simulated node's instance manager serves its volumes
// as files (--fuse-dir) when FUSEFiles is set, else "".
func (o ManagerOptions) FUSEDir(node string) string {
	if !o.FUSEFiles {
		return ""
	}
	return filepath.Join(o.RunDir, "fuse", node)
}

// FreezeSocket is where a node's CSI plugin answers its instance manager's
// filesystem freezes (internal/fsfreeze).
func (o ManagerOptions) FreezeSocket(node string) string {
	return filepath.Join(o.RunDir, "fsfreeze", node+".sock")
}

// BackupDir is where file:// backup targets of the local cluster go: every
// instance manager's --backup-path.
func (o ManagerOptions) BackupDir() string { return filepath.Join(o.RunDir, "backups") }

// Manager is one simulated node's strata-manager process, and its instance
// manager if one was asked for.
type Manager struct {
	*Process
	Node        string
	DiskDir     string
	MetricsAddr string
	// WebhookAddr is where the manager serves the admission webhooks
	// (127.0.0.1:<port>); the leading manager's is in the webhook
	// configurations' URLs.
	WebhookAddr string
	// APIAddr is the manager's HTTP API (backing image uploads and copies).
	APIAddr string
	IM      *InstanceManager
}

// InstanceManager is one simulated node's data plane process.
type InstanceManager struct {
	*Process
	GRPCAddr, NBDSocket, StateDir string
	// FUSEDir is its --fuse-dir, or "".
	FUSEDir string
}

// Stop stops the instance manager and leaves nothing of its files on the
// host: loop devices the CSI node plugin bound to them (recorded while the
// files are live, since the kernel names a file relative to its lost mount
// once it is unmounted) detach on their last close, and mounts a killed
// instance manager left go.
func (im *InstanceManager) Stop(timeout time.Duration) error {
	if im.FUSEDir == "" {
		return im.Process.Stop(timeout)
	}
	loops := LoopDevicesOn(func(file string) bool { return strings.HasPrefix(file, im.FUSEDir+"/") })
	err := im.Process.Stop(timeout)
	return errors.Join(err, unmountUnder(im.FUSEDir), detachLoopDevices(loops))
}

// StartInstanceManager starts the data plane of one simulated node, keeping
// its state under RunDir/nodes/<node>/im so a restart reopens its replicas.
// It may act in the node's directory, where its disks are (the instance
// manager refuses paths under its state directory), and in BackupDir.
// A restart (same addresses) passes the previous one as prev.
func StartInstanceManager(opts ManagerOptions, node string, prev *InstanceManager) (*InstanceManager, error) {
	im := &InstanceManager{StateDir: filepath.Join(opts.NodeDir(node), "im"), NBDSocket: opts.NBDSocket(node), FUSEDir: opts.FUSEDir(node)}
	if len(im.NBDSocket) > unixsock.MaxPath {
		return nil, fmt.Errorf("node %s: NBD socket %s is %d bytes, over the %d a unix socket may have: use a shorter run directory",
			node, im.NBDSocket, len(im.NBDSocket), unixsock.MaxPath)
	}
	if prev != nil {
		im.GRPCAddr = prev.GRPCAddr
	} else {
		ports, err := FreePorts(1)
		if err != nil {
			return nil, err
		}
		im.GRPCAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
	}
	args := []string{"instance-manager", "--listen", im.GRPCAddr, "--nbd-socket", im.NBDSocket, "--state-dir", im.StateDir, "--tls-dir", opts.TLSDir(node),
		"--disk-path", opts.NodeDir(node), "--backup-path", opts.BackupDir(), "--fs-freeze-socket", opts.FreezeSocket(node)}
	for _, d := range opts.ExtraDiskPaths {
		args = append(args, "--disk-path", d)
	}
	if dir := opts.FUSEDir(node); dir != "" {
		args = append(args, "--fuse-dir", dir)
	}
	p, err := StartProcess("instance-manager "+node, filepath.Join(opts.RunDir, "logs", "instance-manager-"+node+".log"),
		opts.Bin, args...)
	if err != nil {
		return nil, err
	}
	im.Process = p
	return im, nil
}

// StartManager starts the manager of one simulated node with its own disk
// directory and a free metrics port, and its instance manager if
// opts.WithInstanceManager.
func StartManager(opts ManagerOptions, node string) (*Manager, error) {
	var im *InstanceManager
	if opts.WithInstanceManager {
		var err error
		if im, err = StartInstanceManager(opts, node, nil); err != nil {
			return nil, err
		}
	}
	m, err := startManagerProcess(opts, node, im)
	if err != nil && im != nil {
		_ = im.Stop(10 * time.Second)
	}
	return m, err
}

// Restart starts the manager process again after it exited, with the same
// disk and the same instance manager, as a restart on a real node would. Its
// metrics and webhook ports are new. opts are the ones it started with: a
// NodeKubeconfig gives it a fresh token bound to its node again.
func (m *Manager) Restart(opts ManagerOptions) (*Manager, error) {
	return startManagerProcess(opts, m.Node, m.IM)
}

// StopAll stops the manager and then its instance manager.
func (m *Manager) StopAll(timeout time.Duration) error {
	err := m.Stop(timeout)
	if m.IM != nil {
		err = errors.Join(err, m.IM.Stop(timeout))
	}
	return err
}

func startManagerProcess(opts ManagerOptions, node string, im *InstanceManager) (*Manager, error) {
	kubeconfig, err := opts.kubeconfig(node)
	if err != nil {
		return nil, err
	}
	disk := filepath.Join(opts.NodeDir(node), "disk-1")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		return nil, err
	}
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	metrics := "127.0.0.1:" + strconv.Itoa(ports[0])
	webhook := "127.0.0.1:" + strconv.Itoa(ports[1])
	apiAddr := "127.0.0.1:" + strconv.Itoa(ports[2])
	args := []string{"daemon",
		"--node-name", node,
		"--kubeconfig", kubeconfig,
		"--namespace", opts.Namespace,
		"--disk", disk,
		"--metrics-listen", metrics,
		"--api-listen", apiAddr,
		"--lease-duration", opts.leaseDuration().String(),
		// Local mode: the leader points the webhook configurations at its
		// own loopback address, since there is no Service to go through.
		"--webhook-listen", webhook,
		"--webhook-url-host", "127.0.0.1",
	}
	if im != nil {
		args = append(args, "--instance-manager-address", im.GRPCAddr, "--instance-manager-tls-dir", opts.TLSDir(node))
	}
	if opts.InstanceManagerPods != "" {
		args = append(args, "--instance-manager-pods", opts.InstanceManagerPods)
	}
	if opts.MaxRetryDelay > 0 {
		args = append(args, "--max-retry-delay", opts.MaxRetryDelay.String())
	}
	// Appending to the same log keeps a node's history across restarts.
	p, err := StartProcess("manager "+node, filepath.Join(opts.RunDir, "logs", "manager-"+node+".log"), opts.Bin, args...)
	if err != nil {
		return nil, err
	}
	return &Manager{Process: p, Node: node, DiskDir: disk, MetricsAddr: metrics, WebhookAddr: webhook, APIAddr: apiAddr, IM: im}, nil
}

// Kill ends the process group with SIGKILL, as a crash would: no shutdown
// code runs. It returns once the process has exited.
func (p *Process) Kill() error {
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.Pid())
	}
}
