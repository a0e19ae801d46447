package localcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/types"
)

// CSIOptions configures StartCSI.
type CSIOptions struct {
	ManagerBin string // strata-manager
	// Namespace is Strata's, where the CSI ServiceAccounts are.
	Namespace string
	// StrataNodes pairs each kubelet node (in StartNodes order) with the
	// Strata node its plugin serves.
	StrataNodes []string
	RepoRoot    string
	// InstanceManagerFileDir is where a Strata node's instance manager
	// serves volumes as files (ManagerOptions.FUSEDir); nil or "": nbdfuse.
	InstanceManagerFileDir func(strataNode string) string
	// FreezeSocket is where a Strata node's plugin answers its instance
	// manager's filesystem freezes (nil: none).
	FreezeSocket func(strataNode string) string
}

// The snapshot-controller's identity (package/manifests/12-rbac-snapshot-controller.yaml),
// where the upstream deployment puts it.
const (
	SnapshotControllerNamespace      = "kube-system"
	SnapshotControllerServiceAccount = "snapshot-controller"
)

// CSIControllerKubeconfig is the kubeconfig StartCSI wrote for the
// controller plugin and its sidecars: the strata-csi-controller
// ServiceAccount's.
func (c *Cluster) CSIControllerKubeconfig() string {
	return c.path("kubeconfigs", types.CSIControllerServiceAccount+".kubeconfig")
}

// CSISidecars are the upstream sidecars StartCSI runs beside the controller
// plugin; scripts/build-tools.sh builds them on demand.
var CSISidecars = []string{"csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter", "snapshot-controller"}

// ChartSidecars are the upstream programs the chart runs, each in an image
// of its own: CSISidecars and the SnapshotMetadata sidecar, which serves
// backup tools over TLS with the certificate the managers issue into a
// Secret (so it runs only where the chart mounts that Secret).
var ChartSidecars = append(slices.Clone(CSISidecars), "csi-snapshot-metadata")

// controllerSidecars talk to the controller plugin's socket. Each exits on
// its first call after losing it (csi-lib-utils), which may come at any
// later time; in a Pod the kubelet starts it again.
var controllerSidecars = []string{"csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"}

// StartCSI runs Strata's CSI driver as a cluster would: the controller
// plugin with the upstream sidecars (csi-provisioner, csi-attacher,
// csi-resizer, csi-snapshotter) and the snapshot-controller, and a node plugin beside each
// kubelet, registering with it. It installs the snapshot CRDs and
// package/csi (CSIDriver, StorageClass strata, VolumeSnapshotClass and
// VolumeGroupSnapshotClass strata).
// Everything stops with the cluster.
func (c *Cluster) StartCSI(ctx context.Context, opts CSIOptions) error {
	if len(opts.StrataNodes) != len(c.nodes) {
		return fmt.Errorf("StartCSI: %d Strata nodes for %d kubelet nodes", len(opts.StrataNodes), len(c.nodes))
	}
	binDir, err := BuildTools(ctx, c.log, CSISidecars...)
	if err != nil {
		return err
	}
	crds, err := BuildTools(ctx, c.log, "snapshot-crds")
	if err != nil {
		return err
	}
	if err := c.ApplyManifests(ctx, crds, filepath.Join(opts.RepoRoot, "package", "csi")); err != nil {
		return err
	}
	// Each process authenticates as its Pod would in a cluster: the
	// controller plugin and its sidecars as strata-csi-controller, the
	// snapshot-controller as its own; the node plugins make no API call
	// and get no credentials.
	if opts.Namespace == "" {
		opts.Namespace = types.DefaultNamespace
	}
	controllerKubeconfig := c.CSIControllerKubeconfig()
	if err := c.ServiceAccountKubeconfig(ctx, opts.Namespace, types.CSIControllerServiceAccount, controllerKubeconfig); err != nil {
		return err
	}
	snapshotKubeconfig := c.path("kubeconfigs", SnapshotControllerServiceAccount+".kubeconfig")
	if err := c.ServiceAccountKubeconfig(ctx, SnapshotControllerNamespace, SnapshotControllerServiceAccount, snapshotKubeconfig); err != nil {
		return err
	}
	socket := c.path("csi", "controller.sock")
	if err := c.runCSI("csi-controller", opts.ManagerBin, "csi", "--mode", "controller", "--csi-address", socket,
		"--namespace", opts.Namespace, "--kubeconfig", controllerKubeconfig); err != nil {
		return err
	}
	// No leader election: one of each runs (and its RBAC grants no Lease).
	// Volume group snapshots are on (the gate is GA and on by default):
	// the driver's GroupController serves them over SnapshotGroup.
	withSocket := []string{"--csi-address=" + socket, "--kubeconfig=" + controllerKubeconfig, "--leader-election=false"}
	sidecars := map[string][]string{
		"csi-provisioner":     append([]string{"--extra-create-metadata", "--timeout=60s", "--default-fstype=ext4"}, withSocket...),
		"csi-attacher":        append([]string{"--timeout=120s"}, withSocket...),
		"csi-resizer":         append([]string{"--timeout=120s"}, withSocket...),
		"csi-snapshotter":     append([]string{"--extra-create-metadata", "--timeout=60s"}, withSocket...),
		"snapshot-controller": {"--kubeconfig=" + snapshotKubeconfig, "--leader-election=false"},
	}
	for _, name := range CSISidecars {
		if err := c.runCSI(name, filepath.Join(binDir, name), sidecars[name]...); err != nil {
			return err
		}
	}
	for i, n := range c.nodes {
		strataNode := opts.StrataNodes[i]
		args := []string{"csi", "--mode", "node", "--node-name", strataNode,
			"--csi-address", n.CSISocket(), "--kubelet-root", n.KubeletRoot(), "--state-dir", n.CSIStateDir()}
		if opts.FreezeSocket != nil {
			args = append(args, "--freeze-socket", opts.FreezeSocket(strataNode))
		}
		if opts.InstanceManagerFileDir != nil {
			if dir := opts.InstanceManagerFileDir(strataNode); dir != "" {
				args = append(args, "--instance-manager-file-dir", dir)
			}
		}
		if err := c.runCSI("csi-node-"+strataNode, opts.ManagerBin, args...); err != nil {
			return err
		}
	}
	c.log.WithFields(logrus.Fields{"sidecars": CSISidecars, "nodes": opts.StrataNodes}).Info("CSI driver and sidecars started")
	return nil
}

// runCSI starts a CSI process that stops with the cluster; RestartCSI
// starts it again with the same arguments.
func (c *Cluster) runCSI(name, bin string, args ...string) error {
	p, err := StartProcess(name, c.path("logs", name+".log"), bin, args...)
	if err != nil {
		return err
	}
	c.csiMu.Lock()
	defer c.csiMu.Unlock()
	if c.csiStopped {
		// Stop has run (a supervisor's restart raced it): this one would
		// outlive the cluster.
		return errors.Join(fmt.Errorf("the cluster is stopping; %s not started", name), p.Stop(stopTimeout))
	}
	c.csiProcs = append(c.csiProcs, p)
	if c.csiCommands == nil {
		c.csiCommands = map[string][]string{}
	}
	c.csiCommands[name] = append([]string{bin}, args...)
	return nil
}

// CSIProcess is the running CSI process of that name (csi-controller,
// csi-node-<strata node>, or a sidecar), nil if none.
func (c *Cluster) CSIProcess(name string) *Process {
	c.csiMu.Lock()
	defer c.csiMu.Unlock()
	for i := len(c.csiProcs) - 1; i >= 0; i-- {
		if p := c.csiProcs[i]; p.Name == name && !p.Exited() {
			return p
		}
	}
	return nil
}

// RestartCSI starts the named CSI process again, as a DaemonSet would after
// a crash; the earlier one must have exited (KillCSI or a crash).
func (c *Cluster) RestartCSI(name string) error {
	c.csiMu.Lock()
	cmd, ok := c.csiCommands[name]
	c.csiMu.Unlock()
	if !ok {
		return fmt.Errorf("no CSI process %s", name)
	}
	if c.CSIProcess(name) != nil {
		return fmt.Errorf("CSI process %s is running", name)
	}
	return c.runCSI(name, cmd[0], cmd[1:]...)
}

// RestartCSIController starts the controller plugin again after it died
// (KillCSI, a crash), and its sidecars with it, as the kubelet would
// restart the containers of its Pod: one still running is stopped and
// started now rather than left to exit in the middle of some later call.
func (c *Cluster) RestartCSIController(stopTimeout time.Duration) error {
	if c.CSIProcess("csi-controller") == nil {
		if err := c.RestartCSI("csi-controller"); err != nil {
			return err
		}
	}
	for _, name := range controllerSidecars {
		if p := c.CSIProcess(name); p != nil {
			if err := p.Stop(stopTimeout); err != nil {
				return fmt.Errorf("stopping %s: %w", name, err)
			}
		}
		if err := c.RestartCSI(name); err != nil {
			return err
		}
	}
	return nil
}

// SuperviseCSI keeps every CSI process running until Stop, as the kubelet
// keeps a DaemonSet's and a Deployment's containers: one that exits starts
// again after a backoff; the controller plugin starts again with its
// sidecars (RestartCSIController). For make run; the end-to-end suite
// restarts what its fault tests kill itself.
func (c *Cluster) SuperviseCSI(log logrus.FieldLogger) {
	ctx, cancel := context.WithCancel(context.Background())
	c.csiMu.Lock()
	c.csiSupervision = cancel
	names := slices.Sorted(maps.Keys(c.csiCommands))
	c.csiMu.Unlock()
	s := &Supervisor{log: log.WithField("component", "csi"), restarts: map[string]int{}}
	for _, name := range names {
		restart := func() (*Process, error) {
			if p := c.CSIProcess(name); p != nil {
				return p, nil // restarted along with the controller plugin
			}
			if err := c.RestartCSI(name); err != nil {
				return nil, err
			}
			return c.CSIProcess(name), nil
		}
		if name == "csi-controller" {
			restart = func() (*Process, error) {
				if err := c.RestartCSIController(stopTimeout); err != nil {
					return nil, err
				}
				return c.CSIProcess(name), nil
			}
		}
		current := func() *Process { return c.CSIProcess(name) }
		if current() == nil {
			continue
		}
		go s.keepRunning(ctx, name, current, restart)
	}
}

// CSISocket is where the node's CSI plugin serves (and the kubelet dials).
func (n *Node) CSISocket() string {
	return filepath.Join(n.KubeletRoot(), "plugins", "driver.strata.io", "csi.sock")
}

// CSIStateDir holds the node plugin's NBD connection records and FUSE mounts.
func (n *Node) CSIStateDir() string { return n.path("csi-state") }
