// Package nbddev turns a Strata volume's NBD export into a block device on
// the node, so the CSI node plugin can format, mount or publish it.
//
// Two implementations exist: the kernel nbd client (qemu-nbd --connect) where
// the nbd module is loaded, and nbdfuse + a loop device everywhere else. Both
// keep no state in memory that matters: the CSI plugin can be killed -9 and
// restarted at any time, while loop devices, FUSE mounts and the daemons
// behind them live on. Every answer is read back from the system (sysfs,
// /proc, the mount table); the only files written are small records in the
// state directory that say which endpoint a volume was connected to.
package nbddev

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engineapi"
)

// Connector turns an NBD export into a block device on this node.
type Connector interface {
	// Connect exposes endpoint (nbd+unix:///name?socket=/path, or nbd://host:port/name)
	// as a block device for volumeID and
	// returns the device path. Idempotent: if volumeID is already connected to the same
	// endpoint, it returns the existing device; connected to another endpoint → error naming both.
	Connect(ctx context.Context, volumeID, endpoint string) (device string, err error)
	// Disconnect removes the block device and everything behind it. Idempotent: nothing
	// connected is not an error. Fails (without tearing down) if the device is still mounted,
	// naming the mount points.
	Disconnect(ctx context.Context, volumeID string) error
	// Device returns the block device of a connected volume, from system state.
	Device(volumeID string) (device string, ok bool, err error)
	// Connected lists the volumes connected on this node, from system state.
	Connected() (map[string]string, error) // volumeID -> device
	// Resize grows a connected volume's block device to the export's size
	// now (after an online expansion) and returns the device's size in bytes.
	Resize(ctx context.Context, volumeID string) (int64, error)
}

// Options say where a connector keeps its state and finds its peers.
type Options struct {
	// StateDir holds the per-volume records (and, for nbdfuse, the FUSE
	// mount points); it must survive plugin restarts, so on a real node it
	// is a host path.
	StateDir string
	// InstanceManagerFileDir is the instance manager's --fuse-dir as
	// mounted here; "" when it serves NBD only.
	InstanceManagerFileDir string
	// DaemonCgroupRoot: FUSELoop.DaemonCgroupRoot.
	DaemonCgroupRoot string
}

// New returns the kernel nbd connector where the nbd module is loaded and
// /dev/nbd0 exists; else, with InstanceManagerFileDir, a loop device on the
// instance manager's file (FileLoop), nbdfuse + loop for what it cannot
// serve; else nbdfuse + loop.
func New(opts Options, log logrus.FieldLogger) (Connector, error) {
	log = log.WithField("stateDir", opts.StateDir)
	if kernelNBDAvailable("/sys", "/dev") {
		log.Info("nbddev: using the kernel nbd client (qemu-nbd --connect)")
		return NewKernelNBD(opts.StateDir, log)
	}
	fuseLoop, err := NewFUSELoop(opts.StateDir, log)
	if err != nil {
		return nil, err
	}
	fuseLoop.DaemonCgroupRoot = opts.DaemonCgroupRoot
	if opts.InstanceManagerFileDir == "" {
		log.Info("nbddev: no kernel nbd module; using nbdfuse + loop devices")
		return fuseLoop, nil
	}
	log.WithField("fileDir", opts.InstanceManagerFileDir).Info(
		"nbddev: no kernel nbd module; loop devices on the instance manager's files, nbdfuse + loop where there is none")
	return NewFileLoop(opts.InstanceManagerFileDir, fuseLoop, log)
}

// kernelNBDAvailable reports whether the nbd module is loaded and its device
// nodes exist (a module loaded in a container without the nodes is useless).
func kernelNBDAvailable(sysRoot, devRoot string) bool {
	if _, err := os.Stat(filepath.Join(sysRoot, "module", "nbd")); err != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(devRoot, "nbd0"))
	return err == nil
}

// volumeIDRE is a DNS-1123 subdomain: what Kubernetes allows as a Volume
// name. The ID becomes a directory and file names under the state directory,
// so slashes, leading dots and upper case are refused.
var volumeIDRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// maxVolumeIDLen leaves room for the longest state file suffix within the
// 255-byte file name limit.
const maxVolumeIDLen = 200

// stateSuffixes are the extensions of per-volume files next to the volume's
// directory. A volume ID ending in one would collide with another volume's
// file ("a.log" is the log of volume "a").
var stateSuffixes = []string{endpointSuffix, logSuffix, deviceSuffix}

const (
	endpointSuffix = ".endpoint"
	logSuffix      = ".log"
	deviceSuffix   = ".device"
)

func validateVolumeID(volumeID string) error {
	if len(volumeID) == 0 || len(volumeID) > maxVolumeIDLen || !volumeIDRE.MatchString(volumeID) {
		return fmt.Errorf("volumeID %q: must be a DNS-1123 name (lower case letters, digits, '-' and '.', at most %d characters)",
			volumeID, maxVolumeIDLen)
	}
	for _, s := range stateSuffixes {
		if strings.HasSuffix(volumeID, s) {
			return fmt.Errorf("volumeID %q: must not end in %q (reserved for state files)", volumeID, s)
		}
	}
	return nil
}

// validateEndpoint accepts what engineapi.ParseNBDEndpoint does:
// nbd+unix:///<export>?socket=<absolute path>, the form the instance manager
// publishes as Volume.status.frontendEndpoint, and nbd://host:port/export
// (older instance managers, connections made before an upgrade). Anything
// else is refused before any tool sees it.
func validateEndpoint(endpoint string) error {
	_, err := engineapi.ParseNBDEndpoint(endpoint)
	return err
}

// withExportSuffix is endpoint naming the export whose name is endpoint's
// and suffix: the growable export nbdfuse reads.
func withExportSuffix(endpoint, suffix string) (string, error) {
	ep, err := engineapi.ParseNBDEndpoint(endpoint)
	if err != nil {
		return "", err
	}
	return ep.WithExport(ep.Export + suffix).String(), nil
}

// withoutExportSuffix undoes withExportSuffix; an endpoint that does not
// parse or whose export does not end in suffix is returned as it is.
func withoutExportSuffix(endpoint, suffix string) string {
	ep, err := engineapi.ParseNBDEndpoint(endpoint)
	if err != nil || !strings.HasSuffix(ep.Export, suffix) {
		return endpoint
	}
	return ep.WithExport(strings.TrimSuffix(ep.Export, suffix)).String()
}

// absStateDir creates stateDir and resolves it to the path the kernel will
// report: loop devices record their backing file's real path, so symlinks in
// stateDir would make recovery miss them.
func absStateDir(stateDir string) (string, error) {
	if stateDir == "" {
		return "", fmt.Errorf("stateDir: must not be empty")
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return "", fmt.Errorf("stateDir %s: %w", stateDir, err)
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return "", fmt.Errorf("stateDir %s: %w", stateDir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("stateDir %s: %w", stateDir, err)
	}
	return real, nil
}

// volumeLocks serialises operations on one volume within this process. CSI
// says the CO does not call concurrently for one volume, but retries after a
// timeout can overlap the call still running.
type volumeLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (v *volumeLocks) lock(volumeID string) (unlock func()) {
	v.mu.Lock()
	if v.locks == nil {
		v.locks = map[string]*sync.Mutex{}
	}
	l, ok := v.locks[volumeID]
	if !ok {
		l = &sync.Mutex{}
		v.locks[volumeID] = l
	}
	v.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// validateConnect checks Connect's arguments, naming the volume for a bad
// endpoint.
func validateConnect(volumeID, endpoint string) error {
	if err := validateVolumeID(volumeID); err != nil {
		return err
	}
	if err := validateEndpoint(endpoint); err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	return nil
}
