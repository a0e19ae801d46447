package nbddev

import (
	"github.com/strata-storage/strata/internal/atomicfile"

	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engineapi"
)

// FUSELoop connects volumes with nbdfuse and a loop device, for nodes
// without the kernel nbd module. Per volume it keeps, under stateDir:
//
//	<volumeID>/          the FUSE mount point; nbdfuse shows the export as <volumeID>/nbd
//	<volumeID>.endpoint  the endpoint the volume was connected to (atomic record)
//	<volumeID>.log       nbdfuse's output
//
// and the loop device bound to <volumeID>/nbd. nbdfuse runs in its own
// session so it outlives the plugin; after a restart it is found again by
// its command line (a FUSE mount does not name its daemon), the mount by
// /proc/self/mountinfo and the loop device by its backing file in sysfs.
//
// In a Pod, nbdfuse outlives a plugin container restart only if it is not in
// the container's PID namespace (hostPID: true, as Longhorn's plugin runs):
// when a namespace's first process dies, the kernel kills all the others.
type FUSELoop struct {
	// DaemonCgroupRoot, when set, is the host's cgroup filesystem as the
	// plugin sees it: each nbdfuse is moved out of the plugin container's
	// cgroup (moveToDaemonCgroup), so a container stop leaves it running.
	DaemonCgroupRoot string

	stateDir string
	log      logrus.FieldLogger
	locks    volumeLocks

	// readyTimeout bounds the wait for nbdfuse to show the export.
	readyTimeout time.Duration
	// probeTimeout bounds the read that checks an existing connection.
	probeTimeout time.Duration
	// exitGrace is how long nbdfuse gets to exit after its unmount (and
	// after each signal) before it is killed.
	exitGrace time.Duration
	// crashPoint, when set, is called after each step of Connect with the
	// step's name; tests use it to die between steps as a killed plugin would.
	crashPoint func(step string)
	// exportSuffix names the export nbdfuse reads, after the endpoint's:
	// the engine's growable export (engineapi.GrowableExportSuffix), whose
	// advertised size leaves room for Resize. Tests serving one plain
	// export (qemu-nbd) clear it.
	exportSuffix string
}

// Steps of Connect, as passed to crashPoint.
const (
	stepEndpointRecorded = "endpoint-recorded"
	stepFUSEReady        = "fuse-ready"
	stepLoopAttached     = "loop-attached"
)

var _ Connector = (*FUSELoop)(nil)

// NewFUSELoop returns the nbdfuse + loop connector. It needs nbdfuse
// (Debian libnbd-bin), losetup and umount, /dev/fuse and loop devices.
func NewFUSELoop(stateDir string, log logrus.FieldLogger) (*FUSELoop, error) {
	for _, tool := range []string{"nbdfuse", "nbdinfo", "losetup", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("nbddev: %s is needed for nbdfuse + loop devices: %w", tool, err)
		}
	}
	dir, err := absStateDir(stateDir)
	if err != nil {
		return nil, err
	}
	return &FUSELoop{stateDir: dir, log: log, readyTimeout: 30 * time.Second, probeTimeout: 5 * time.Second, exitGrace: 10 * time.Second,
		exportSuffix: engineapi.GrowableExportSuffix}, nil
}

func (c *FUSELoop) mountDir(volumeID string) string { return filepath.Join(c.stateDir, volumeID) }
func (c *FUSELoop) backingFile(volumeID string) string {
	return filepath.Join(c.mountDir(volumeID), "nbd")
}
func (c *FUSELoop) endpointFile(volumeID string) string {
	return filepath.Join(c.stateDir, volumeID+endpointSuffix)
}
func (c *FUSELoop) logFile(volumeID string) string {
	return filepath.Join(c.stateDir, volumeID+logSuffix)
}

// fuseState is what the system says about one volume.
type fuseState struct {
	mounted  bool      // a FUSE filesystem is mounted on the volume's directory
	daemons  []process // nbdfuse processes serving that directory
	loop     string    // loop device bound to <dir>/nbd, or ""
	endpoint string    // endpoint recorded, or from nbdfuse's arguments
}

// active reports whether anything of the volume is up.
func (s fuseState) active() bool { return s.mounted || len(s.daemons) > 0 || s.loop != "" }

// healthy is a complete connection: one live nbdfuse, its mount, a loop device.
func (s fuseState) healthy() bool { return s.mounted && len(s.daemons) == 1 && s.loop != "" }

// halfDone is a Connect that stopped after nbdfuse was ready and before the
// loop device was bound: finishing it is one losetup.
func (s fuseState) halfDone() bool { return s.mounted && len(s.daemons) == 1 && s.loop == "" }

func (c *FUSELoop) inspect(volumeID string) (fuseState, error) {
	var st fuseState
	dir := c.mountDir(volumeID)
	entries, err := readMountInfo()
	if err != nil {
		return st, fmt.Errorf("volume %s: %w", volumeID, err)
	}
	_, st.mounted = fuseMountAt(entries, dir)
	st.daemons, err = findProcesses("nbdfuse", func(args []string) bool { return nbdfuseURI(args, dir) != "" })
	if err != nil {
		return st, fmt.Errorf("volume %s: listing nbdfuse processes: %w", volumeID, err)
	}
	st.loop, _, err = loopDeviceFor(c.backingFile(volumeID))
	if err != nil {
		return st, fmt.Errorf("volume %s: listing loop devices: %w", volumeID, err)
	}
	st.endpoint, err = readRecord(c.endpointFile(volumeID))
	if err != nil {
		return st, fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if st.endpoint == "" && len(st.daemons) > 0 {
		// The record is written before nbdfuse starts, so this is only a
		// lost file; the daemon's own arguments still say it.
		st.endpoint = nbdfuseURI(st.daemons[0].Args[1:], dir)
		if c.exportSuffix != "" {
			st.endpoint = withoutExportSuffix(st.endpoint, c.exportSuffix)
		}
	}
	return st, nil
}

// nbdfuseURI returns the URI argument of an nbdfuse command line that
// mounts dir ("nbdfuse [options] DIR/ URI"), or "" if it mounts elsewhere.
func nbdfuseURI(args []string, dir string) string {
	for i := 0; i+1 < len(args); i++ {
		if filepath.IsAbs(args[i]) && filepath.Clean(args[i]) == dir {
			return args[i+1]
		}
	}
	return ""
}

func (c *FUSELoop) Connect(ctx context.Context, volumeID, endpoint string) (string, error) {
	if err := validateConnect(volumeID, endpoint); err != nil {
		return "", err
	}
	defer c.locks.lock(volumeID)()
	log := c.log.WithFields(logrus.Fields{"volume": volumeID, "endpoint": endpoint})
	start := time.Now()

	st, err := c.inspect(volumeID)
	if err != nil {
		return "", err
	}
	if dev, ok, err := c.existing(log, volumeID, endpoint, st); err != nil || ok {
		return dev, err
	}
	if st.halfDone() {
		log.Info("nbddev: completing an interrupted connect (nbdfuse up, no loop device)")
	} else if err := c.startOver(ctx, log, volumeID, endpoint, st); err != nil {
		return "", err
	}
	size, err := exportSize(ctx, endpoint)
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", volumeID, err)
	}
	dev, err := attachLoop(ctx, log, c.backingFile(volumeID), size)
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", volumeID, err)
	}
	c.crash(stepLoopAttached)
	log.WithFields(logrus.Fields{"device": dev, "elapsed": time.Since(start).Round(time.Millisecond)}).Info("nbddev: connected")
	return dev, nil
}

// existing returns the device of a complete connection to endpoint that
// answers. A connection to another endpoint is an error, and so is a dead
// one whose device is in use (it cannot be replaced under a mount).
func (c *FUSELoop) existing(log logrus.FieldLogger, volumeID, endpoint string, st fuseState) (string, bool, error) {
	if st.active() && st.endpoint != "" && st.endpoint != endpoint {
		return "", false, fmt.Errorf("volume %s is connected to %s, not %s; disconnect it first", volumeID, st.endpoint, endpoint)
	}
	if !st.healthy() {
		return "", false, nil
	}
	probeErr := probeDevice(st.loop, c.probeTimeout)
	if probeErr == nil {
		log.WithField("device", st.loop).Debug("nbddev: already connected")
		return st.loop, true, nil
	}
	log.WithError(probeErr).WithField("device", st.loop).Warn("nbddev: the existing connection does not answer")
	if err := checkUnused(volumeID, st.loop); err != nil {
		return "", false, fmt.Errorf("%w; and its connection to %s is dead (%v): unmount it, then connect again", err, st.endpoint, probeErr)
	}
	return "", false, nil
}

// startOver clears whatever is left of an earlier connection (a dead
// nbdfuse, a lost mount, a daemon that never got ready, a device that does
// not answer) and starts nbdfuse afresh.
func (c *FUSELoop) startOver(ctx context.Context, log logrus.FieldLogger, volumeID, endpoint string, st fuseState) error {
	if st.active() {
		log.WithFields(stateFields(st)).Warn("nbddev: tearing down a broken connection before reconnecting")
		// A dead connection whose nbdfuse is gone (libnbd 1.14's nbdfuse
		// aborts on a request to an nbd+unix server that went away) is as
		// much in use as one whose nbdfuse stays up failing requests.
		if st.loop != "" {
			if err := checkUnused(volumeID, st.loop); err != nil {
				return fmt.Errorf("%w; and its connection to %s is dead (FUSE mounted: %v, nbdfuse processes: %d): unmount it, then connect again",
					err, st.endpoint, st.mounted, len(st.daemons))
			}
		}
		if err := c.teardown(ctx, volumeID, st); err != nil {
			return err
		}
	}
	return c.startNBDFUSE(ctx, log, volumeID, endpoint)
}

func stateFields(st fuseState) logrus.Fields {
	return logrus.Fields{"fuseMounted": st.mounted, "nbdfuseProcesses": len(st.daemons), "loop": st.loop}
}

func (c *FUSELoop) crash(step string) {
	if c.crashPoint != nil {
		c.crashPoint(step)
	}
}

// startNBDFUSE records the endpoint, starts nbdfuse as a daemon of its own
// and waits until the export shows as <dir>/nbd.
func (c *FUSELoop) startNBDFUSE(ctx context.Context, log logrus.FieldLogger, volumeID, endpoint string) error {
	dir := c.mountDir(volumeID)
	// The growable export: nbdfuse's file keeps the size it sees at connect,
	// so it must see the ceiling for the loop device to grow later (Resize).
	uri, err := withExportSuffix(endpoint, c.exportSuffix)
	if err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	// Before the daemon starts: every live daemon then has its record.
	if err := atomicfile.WriteFile(c.endpointFile(volumeID), []byte(endpoint+"\n")); err != nil {
		return fmt.Errorf("volume %s: recording the endpoint: %w", volumeID, err)
	}
	c.crash(stepEndpointRecorded)
	logPath := c.logFile(volumeID)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	// Not CommandContext: the daemon must outlive this call and this process.
	cmd := exec.Command("nbdfuse", dir+"/", uri)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own session: no signal for our process group or terminal reaches it,
	// and no Pdeathsig, so a plugin restart leaves the device working.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return fmt.Errorf("volume %s: starting nbdfuse %s/ %s: %w", volumeID, dir, endpoint, err)
	}
	// Reap it whenever it exits, so no zombie is left while we live; after
	// a restart it is init's (or the subreaper's) child.
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if c.DaemonCgroupRoot != "" {
		self, err := os.ReadFile("/proc/self/cgroup")
		if err == nil {
			err = moveToDaemonCgroup(c.DaemonCgroupRoot, string(self), cmd.Process.Pid)
		}
		if err != nil {
			// The device works; it only dies with this container.
			log.WithError(err).Warn("nbddev: nbdfuse stays in the plugin's cgroup: a plugin restart will cut this volume off")
		}
	}

	if err := c.waitReady(ctx, volumeID, exited); err != nil {
		c.abandonStart(volumeID, cmd.Process.Pid, log)
		return fmt.Errorf("volume %s: nbdfuse %s/ %s: %w; log %s: %s", volumeID, dir, endpoint, err, logPath, logTail(logPath))
	}
	c.crash(stepFUSEReady)
	log.WithField("pid", cmd.Process.Pid).Debug("nbddev: nbdfuse ready")
	return nil
}

// waitReady waits for <dir>/nbd, which exists only once nbdfuse has
// connected to the export and mounted the directory.
func (c *FUSELoop) waitReady(ctx context.Context, volumeID string, exited <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, c.readyTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(c.backingFile(volumeID)); err == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("exited before the export appeared (%v)", err)
		case <-ctx.Done():
			return fmt.Errorf("export did not appear: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// abandonStart undoes a start that did not get ready: the mount (if it
// came up meanwhile), the daemon and the directory. The log stays for the
// next attempt and for whoever reads the error.
func (c *FUSELoop) abandonStart(volumeID string, pid int, log logrus.FieldLogger) {
	dir := c.mountDir(volumeID)
	if entries, err := readMountInfo(); err == nil {
		if _, mounted := fuseMountAt(entries, dir); mounted {
			if err := unmountFUSE(context.Background(), dir); err != nil {
				log.WithError(err).Warn("nbddev: unmounting after a failed start")
			}
		}
	}
	if err := stopProcess(pid, 0, time.Second); err != nil {
		log.WithError(err).Warn("nbddev: stopping nbdfuse after a failed start")
	}
	_ = removeIfExists(dir)
	_ = removeIfExists(c.endpointFile(volumeID))
}

func (c *FUSELoop) Disconnect(ctx context.Context, volumeID string) error {
	if err := validateVolumeID(volumeID); err != nil {
		return err
	}
	defer c.locks.lock(volumeID)()
	st, err := c.inspect(volumeID)
	if err != nil {
		return err
	}
	if err := c.teardown(ctx, volumeID, st); err != nil {
		return err
	}
	if err := removeIfExists(c.logFile(volumeID)); err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if st.active() {
		c.log.WithFields(stateFields(st)).WithField("volume", volumeID).Info("nbddev: disconnected")
	}
	return nil
}

// teardown removes a volume's pieces top down: the loop device (refused if
// it is in use), the FUSE mount, the daemon, the directory and the record.
// Each step is skipped when its piece is already gone, so it finishes any
// earlier teardown that was interrupted.
func (c *FUSELoop) teardown(ctx context.Context, volumeID string, st fuseState) error {
	dir := c.mountDir(volumeID)
	if st.loop != "" {
		if err := checkUnused(volumeID, st.loop); err != nil {
			return err
		}
		if err := detachLoop(ctx, volumeID, st.loop, c.backingFile(volumeID)); err != nil {
			return err
		}
	}
	if st.mounted {
		if err := unmountFUSE(ctx, dir); err != nil {
			return fmt.Errorf("volume %s: %w", volumeID, err)
		}
	}
	// Unmounted, nbdfuse exits by itself; without a mount it was never
	// serving (or still connecting) and is stopped at once.
	selfExit := time.Duration(0)
	if st.mounted {
		selfExit = c.exitGrace
	}
	for _, p := range st.daemons {
		if err := stopProcess(p.PID, selfExit, c.exitGrace); err != nil {
			return fmt.Errorf("volume %s: nbdfuse: %w", volumeID, err)
		}
	}
	if err := removeIfExists(dir); err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if err := removeIfExists(c.endpointFile(volumeID)); err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	return nil
}

// unmountFUSE unmounts an nbdfuse directory; nbdfuse then exits by itself.
// fusermount3 is the documented way but is not installed everywhere (not on
// these machines); as root, umount does the same.
func unmountFUSE(ctx context.Context, dir string) error {
	if _, err := exec.LookPath("fusermount3"); err == nil {
		_, err := run(ctx, "fusermount3", "-u", dir)
		return err
	}
	_, err := run(ctx, "umount", dir)
	return err
}

func (c *FUSELoop) Device(volumeID string) (string, bool, error) {
	if err := validateVolumeID(volumeID); err != nil {
		return "", false, err
	}
	dev, ok, err := loopDeviceFor(c.backingFile(volumeID))
	if err != nil {
		return "", false, fmt.Errorf("volume %s: %w", volumeID, err)
	}
	return dev, ok, nil
}

// Connected lists the loop devices backed by a volume file in stateDir.
// A half-done connect (no loop device yet) is not listed: it has no device.
func (c *FUSELoop) Connected() (map[string]string, error) {
	loops, err := loopBackingFiles()
	if err != nil {
		return nil, err
	}
	volumes := map[string]string{}
	for backing, dev := range loops {
		if filepath.Base(backing) != "nbd" || filepath.Dir(filepath.Dir(backing)) != c.stateDir {
			continue
		}
		id := filepath.Base(filepath.Dir(backing))
		if validateVolumeID(id) == nil {
			volumes[id] = dev
		}
	}
	return volumes, nil
}
