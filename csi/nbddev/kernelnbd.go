package nbddev

// The kernel nbd connector has NOT been run against a real kernel nbd
// module: the machines this was written on have no nbd module and no
// /dev/nbd*. What is tested here is the choice of a free device from a fake
// sysfs tree, the recovery of a connection from sysfs and /proc, and that
// qemu-nbd opens an nbd+unix:// (and an nbd://) URI with exactly the image
// options used for --connect (by serving it again, which needs no module).

import (
	"github.com/strata-storage/strata/internal/atomicfile"

	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// KernelNBD connects volumes with the kernel nbd client, set up by
// `qemu-nbd --connect`, which stays as the daemon that carries the
// connection. Per volume it records, under stateDir, <volumeID>.endpoint and
// <volumeID>.device; a record counts only while sysfs says the device is
// connected by a qemu-nbd whose command line names that device.
type KernelNBD struct {
	stateDir string
	sysRoot  string // "/sys"; a fake tree in tests
	devRoot  string // "/dev"
	log      logrus.FieldLogger
	locks    volumeLocks
}

var _ Connector = (*KernelNBD)(nil)

// NewKernelNBD returns the kernel nbd connector. It needs qemu-nbd (Debian
// qemu-utils) and the nbd module.
func NewKernelNBD(stateDir string, log logrus.FieldLogger) (*KernelNBD, error) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		return nil, fmt.Errorf("nbddev: qemu-nbd is needed for the kernel nbd client: %w", err)
	}
	dir, err := absStateDir(stateDir)
	if err != nil {
		return nil, err
	}
	return &KernelNBD{stateDir: dir, sysRoot: "/sys", devRoot: "/dev", log: log}, nil
}

func (c *KernelNBD) endpointFile(volumeID string) string {
	return filepath.Join(c.stateDir, volumeID+endpointSuffix)
}
func (c *KernelNBD) deviceFile(volumeID string) string {
	return filepath.Join(c.stateDir, volumeID+deviceSuffix)
}

// qemuNBDImageArgs are the image options for the export: raw (the export
// is the volume's bytes) and no host cache, so a flush reaches Strata. qemu's
// block layer opens nbd+unix:// and nbd:// URIs itself.
func qemuNBDImageArgs(endpoint string) []string {
	return []string{"--format=raw", "--cache=none", endpoint}
}

// freeNBDDevices lists nbd devices (by name, "nbd3") not connected: no
// pid attribute and size 0, in numeric order.
func freeNBDDevices(sysRoot string) ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(sysRoot, "block", "nbd*"))
	if err != nil {
		return nil, err
	}
	var free []string
	for _, p := range paths {
		name := filepath.Base(p)
		if _, err := strconv.Atoi(strings.TrimPrefix(name, "nbd")); err != nil {
			continue // a partition like nbd0p1
		}
		_, hasPID, err := readSysfs(filepath.Join(p, "pid"))
		if err != nil {
			return nil, err
		}
		size, _, err := readSysfs(filepath.Join(p, "size"))
		if err != nil {
			return nil, err
		}
		if !hasPID && (size == "" || size == "0") {
			free = append(free, name)
		}
	}
	sort.Slice(free, func(i, j int) bool { return nbdIndex(free[i]) < nbdIndex(free[j]) })
	return free, nil
}

func nbdIndex(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "nbd"))
	return n
}

// connectedBy returns the pid connecting device per sysfs, and whether it
// is a qemu-nbd connecting that very device (pids get reused) to endpoint
// (a stale record may name a device another volume has taken since); an
// empty endpoint matches any.
func (c *KernelNBD) connectedBy(device, endpoint string) (int, bool, error) {
	raw, ok, err := readSysfs(filepath.Join(c.sysRoot, "block", filepath.Base(device), "pid"))
	if err != nil || !ok {
		return 0, false, err
	}
	pid, err := strconv.Atoi(raw)
	if err != nil {
		return 0, false, fmt.Errorf("%s: pid %q: %w", device, raw, err)
	}
	procs, err := findProcesses("qemu-nbd", func(args []string) bool {
		return connectArg(args) == device && (endpoint == "" || slices.Contains(args, endpoint))
	})
	if err != nil {
		return 0, false, err
	}
	for _, p := range procs {
		if p.PID == pid {
			return pid, true, nil
		}
	}
	return pid, false, nil
}

// connectArg returns the device of a qemu-nbd --connect command line.
func connectArg(args []string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--connect="); ok {
			return v
		}
		if (a == "--connect" || a == "-c") && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func (c *KernelNBD) Device(volumeID string) (string, bool, error) {
	if err := validateVolumeID(volumeID); err != nil {
		return "", false, err
	}
	dev, err := readRecord(c.deviceFile(volumeID))
	if err != nil || dev == "" {
		return "", false, err
	}
	endpoint, err := readRecord(c.endpointFile(volumeID))
	if err != nil || endpoint == "" {
		return "", false, err
	}
	_, ok, err := c.connectedBy(dev, endpoint)
	if err != nil {
		return "", false, fmt.Errorf("volume %s: device %s: %w", volumeID, dev, err)
	}
	return dev, ok, nil
}

func (c *KernelNBD) Connected() (map[string]string, error) {
	records, err := filepath.Glob(filepath.Join(c.stateDir, "*"+deviceSuffix))
	if err != nil {
		return nil, err
	}
	volumes := map[string]string{}
	for _, r := range records {
		id := strings.TrimSuffix(filepath.Base(r), deviceSuffix)
		if validateVolumeID(id) != nil {
			continue
		}
		dev, ok, err := c.Device(id)
		if err != nil {
			return nil, err
		}
		if ok {
			volumes[id] = dev
		}
	}
	return volumes, nil
}

func (c *KernelNBD) Connect(ctx context.Context, volumeID, endpoint string) (string, error) {
	if err := validateConnect(volumeID, endpoint); err != nil {
		return "", err
	}
	defer c.locks.lock(volumeID)()
	log := c.log.WithFields(logrus.Fields{"volume": volumeID, "endpoint": endpoint})
	if dev, ok, err := c.existing(volumeID, endpoint); err != nil || ok {
		return dev, err
	}
	free, err := freeNBDDevices(c.sysRoot)
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", volumeID, err)
	}
	// Another connector may take the same device between our look and
	// qemu-nbd's ioctl; then qemu-nbd fails and the next device is tried.
	var errs []string
	for _, name := range free[:min(len(free), 3)] {
		dev := filepath.Join(c.devRoot, name)
		if err := c.connectDevice(ctx, volumeID, endpoint, dev); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		log.WithField("device", dev).Info("nbddev: connected (kernel nbd)")
		return dev, nil
	}
	// The records name no live connection now; leave none behind.
	_ = removeIfExists(c.deviceFile(volumeID))
	_ = removeIfExists(c.endpointFile(volumeID))
	if len(errs) == 0 {
		return "", fmt.Errorf("volume %s: no free nbd device under %s", volumeID, filepath.Join(c.sysRoot, "block"))
	}
	return "", fmt.Errorf("volume %s: %s", volumeID, strings.Join(errs, "; "))
}

// existing returns the device of volumeID if it is connected to endpoint;
// connected to another endpoint is an error.
func (c *KernelNBD) existing(volumeID, endpoint string) (string, bool, error) {
	dev, ok, err := c.Device(volumeID)
	if err != nil || !ok {
		return "", false, err
	}
	recorded, err := readRecord(c.endpointFile(volumeID))
	if err != nil {
		return "", false, fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if recorded != endpoint {
		return "", false, fmt.Errorf("volume %s is connected to %s (device %s), not %s; disconnect it first", volumeID, recorded, dev, endpoint)
	}
	return dev, true, nil
}

// connectDevice records the connection, then has qemu-nbd set it up.
// qemu-nbd --connect forks a daemon that carries the connection and
// returns once the device is ready; its own session keeps that daemon clear
// of our process group.
func (c *KernelNBD) connectDevice(ctx context.Context, volumeID, endpoint, dev string) error {
	if err := atomicfile.WriteFile(c.endpointFile(volumeID), []byte(endpoint+"\n")); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(c.deviceFile(volumeID), []byte(dev+"\n")); err != nil {
		return err
	}
	args := append([]string{"--connect=" + dev}, qemuNBDImageArgs(endpoint)...)
	cmd := exec.CommandContext(ctx, "qemu-nbd", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-nbd %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	if !waitFor(10*time.Second, func() bool { _, ok, _ := c.connectedBy(dev, endpoint); return ok }) {
		return fmt.Errorf("qemu-nbd %s returned but sysfs shows no qemu-nbd on %s", strings.Join(args, " "), dev)
	}
	return nil
}

func (c *KernelNBD) Disconnect(ctx context.Context, volumeID string) error {
	if err := validateVolumeID(volumeID); err != nil {
		return err
	}
	defer c.locks.lock(volumeID)()
	dev, ok, err := c.Device(volumeID)
	if err != nil {
		return err
	}
	if ok {
		if err := checkUnused(volumeID, dev); err != nil {
			return err
		}
		if _, err := run(ctx, "qemu-nbd", "--disconnect", dev); err != nil {
			return fmt.Errorf("volume %s: %w", volumeID, err)
		}
		if !waitFor(10*time.Second, func() bool { _, ok, _ := c.connectedBy(dev, ""); return !ok }) {
			return fmt.Errorf("volume %s: %s still connected after qemu-nbd --disconnect", volumeID, dev)
		}
		c.log.WithFields(logrus.Fields{"volume": volumeID, "device": dev}).Info("nbddev: disconnected (kernel nbd)")
	}
	for _, f := range []string{c.deviceFile(volumeID), c.endpointFile(volumeID)} {
		if err := removeIfExists(f); err != nil {
			return fmt.Errorf("volume %s: %w", volumeID, err)
		}
	}
	return nil
}
