package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// ManagerOptions are what every simulated node's strata-manager shares.
type ManagerOptions struct {
	Bin        string // strata-manager binary
	Kubeconfig string // the manager ServiceAccount's kubeconfig
	Namespace  string
	// RunDir holds nodes/<node>/disk-1 and logs/manager-<node>.log.
	RunDir        string
	LeaseDuration time.Duration
}

// Manager is one simulated node's strata-manager process.
type Manager struct {
	*Process
	Node        string
	DiskDir     string
	MetricsAddr string
}

// StartManager starts the manager of one simulated node with its own disk
// directory and a free metrics port. Starting it again for the same node
// reuses the disk and appends to the same log, as a restart on a real node would.
func StartManager(opts ManagerOptions, node string) (*Manager, error) {
	disk := filepath.Join(opts.RunDir, "nodes", node, "disk-1")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		return nil, err
	}
	ports, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	metrics := "127.0.0.1:" + strconv.Itoa(ports[0])
	lease := opts.LeaseDuration
	if lease == 0 {
		lease = 10 * time.Second
	}
	logPath := filepath.Join(opts.RunDir, "logs", "manager-"+node+".log")
	p, err := StartProcess("manager "+node, logPath, opts.Bin, "daemon",
		"--node-name", node,
		"--kubeconfig", opts.Kubeconfig,
		"--namespace", opts.Namespace,
		"--disk", disk,
		"--metrics-listen", metrics,
		"--lease-duration", lease.String(),
	)
	if err != nil {
		return nil, err
	}
	return &Manager{Process: p, Node: node, DiskDir: disk, MetricsAddr: metrics}, nil
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
