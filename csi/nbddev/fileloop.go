package nbddev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/atomicfile"
)

// FileLoop connects a volume whose engine runs on this node through the
// file its instance manager serves (strata-manager instance-manager
// --fuse-dir, engine/fusefile): a loop device in direct-I/O mode on
// <fileDir>/<volumeID>/disk. That path has no NBD hop and no daemon of the
// plugin's own, and measured 2-3x nbdfuse's IOPS (docs/bench-kbench.md).
//
// Volumes it cannot serve that way go to Fallback (nbdfuse + loop): an
// endpoint on another node, an instance manager without --fuse-dir, or a
// connection Fallback made before (a volume staged before an upgrade keeps
// its nbdfuse until it is unstaged).
//
// The instance manager owns the mount. A loop device on a live file is
// found by its backing file in sysfs; one on the file of an instance
// manager that was killed is not (the kernel then names the file relative
// to its lost mount: "/disk"), so each connection is also recorded in
// <stateDir>/<volumeID>.device with the device and inode numbers of the
// file it is bound to.
type FileLoop struct {
	Fallback *FUSELoop

	fileDir string
	log     logrus.FieldLogger
	locks   volumeLocks
	// probeTimeout bounds the read that checks an existing connection.
	probeTimeout time.Duration
}

var _ Connector = (*FileLoop)(nil)

// NewFileLoop serves volumes from the instance manager's files in fileDir
// (its --fuse-dir as mounted here), others through fallback.
func NewFileLoop(fileDir string, fallback *FUSELoop, log logrus.FieldLogger) (*FileLoop, error) {
	if fileDir == "" {
		return nil, fmt.Errorf("nbddev: the instance manager's file directory must not be empty")
	}
	dir, err := filepath.Abs(fileDir)
	if err != nil {
		return nil, fmt.Errorf("nbddev: instance manager file directory %s: %w", fileDir, err)
	}
	// The instance manager may start after the plugin: the directory need
	// not exist yet, but a symlink in it would hide connections from
	// Connected (sysfs names the resolved path).
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return &FileLoop{Fallback: fallback, fileDir: dir, log: log, probeTimeout: 5 * time.Second}, nil
}

// file is where the instance manager serves volumeID.
func (c *FileLoop) file(volumeID string) string { return engineapi.FUSEFile(c.fileDir, volumeID) }

// served reports whether endpoint is this node's instance manager's export
// of volumeID and the instance manager serves the volume as a file now.
func (c *FileLoop) served(volumeID, endpoint string) (bool, error) {
	ep, err := engineapi.ParseNBDEndpoint(endpoint)
	if err != nil || ep.Socket == "" || ep.Export != volumeID {
		return false, err
	}
	entries, err := readMountInfo()
	if err != nil {
		return false, err
	}
	if _, ok := fuseMountAt(entries, filepath.Dir(c.file(volumeID))); !ok {
		return false, nil
	}
	_, err = os.Stat(c.file(volumeID))
	return err == nil, nil
}

func (c *FileLoop) Connect(ctx context.Context, volumeID, endpoint string) (string, error) {
	if err := validateConnect(volumeID, endpoint); err != nil {
		return "", err
	}
	dev, fallback, err := c.connect(ctx, volumeID, endpoint)
	if fallback {
		return c.Fallback.Connect(ctx, volumeID, endpoint)
	}
	return dev, err
}

// connect connects volumeID through its file, or says it is Fallback's: a
// connection Fallback made (whole or in part) stays Fallback's, and so
// does a volume this node's instance manager does not serve as a file.
func (c *FileLoop) connect(ctx context.Context, volumeID, endpoint string) (dev string, fallback bool, err error) {
	defer c.locks.lock(volumeID)()
	live, stale, err := c.loops(volumeID)
	if err == nil && stale.device != "" {
		err = c.detachStale(ctx, volumeID, stale)
	}
	if err != nil {
		return "", false, err
	}
	if live == "" {
		fb, err := c.Fallback.inspect(volumeID)
		if err != nil {
			return "", false, err
		}
		served, err := c.served(volumeID, endpoint)
		if err != nil {
			return "", false, fmt.Errorf("volume %s: %w", volumeID, err)
		}
		if fb.active() || !served {
			return "", true, nil
		}
	}
	dev, err = c.connectFile(ctx, volumeID, live)
	return dev, false, err
}

// detachStale detaches a loop device left on the file of an instance
// manager that was killed, unless something still uses it.
func (c *FileLoop) detachStale(ctx context.Context, volumeID string, stale staleLoop) error {
	c.log.WithFields(logrus.Fields{"volume": volumeID, "device": stale.device, "backing": stale.backing}).Warn(
		"nbddev: the loop device is on the file of an instance manager that is gone")
	if err := checkUnused(volumeID, stale.device); err != nil {
		return fmt.Errorf("%w; and its instance manager's file is gone: unmount it, then connect again", err)
	}
	if err := detachLoop(ctx, volumeID, stale.device, stale.backing); err != nil {
		return err
	}
	return removeIfExists(c.recordFile(volumeID))
}

// connectFile returns live if it answers, else binds a new loop device to
// the volume's file, and records it.
func (c *FileLoop) connectFile(ctx context.Context, volumeID, live string) (string, error) {
	log := c.log.WithFields(logrus.Fields{"volume": volumeID, "file": c.file(volumeID)})
	if live != "" {
		probeErr := probeDevice(live, c.probeTimeout)
		if probeErr == nil {
			// A connect that stopped before its record is finished here.
			return live, c.record(volumeID, live)
		}
		log.WithError(probeErr).WithField("device", live).Warn("nbddev: the loop device on the instance manager's file does not answer")
		if err := checkUnused(volumeID, live); err != nil {
			return "", fmt.Errorf("%w; and its file does not answer (%v): unmount it, then connect again", err, probeErr)
		}
		if err := detachLoop(ctx, volumeID, live, c.file(volumeID)); err != nil {
			return "", err
		}
	}
	size, err := fileSize(c.file(volumeID))
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", volumeID, err)
	}
	dev, err := attachLoop(ctx, log, c.file(volumeID), size)
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if err := c.record(volumeID, dev); err != nil {
		return "", err
	}
	log.WithField("device", dev).Info("nbddev: connected to the instance manager's file")
	return dev, nil
}

func (c *FileLoop) recordFile(volumeID string) string {
	return filepath.Join(c.Fallback.stateDir, volumeID+deviceSuffix)
}

// record notes that loop is volumeID's and which file it is bound to.
func (c *FileLoop) record(volumeID, loop string) error {
	id, err := loopFileID(loop)
	if err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	line := fmt.Sprintf("%s %d %d\n", loop, id.dev, id.ino)
	if old, err := readRecord(c.recordFile(volumeID)); err == nil && old+"\n" == line {
		return nil
	}
	if err := atomicfile.WriteFile(c.recordFile(volumeID), []byte(line)); err != nil {
		return fmt.Errorf("volume %s: recording its loop device: %w", volumeID, err)
	}
	return nil
}

// parseRecord reads a record's line: the device and its file's numbers.
func parseRecord(line string) (device string, id fileID, err error) {
	_, err = fmt.Sscanf(line, "%s %d %d", &device, &id.dev, &id.ino)
	return device, id, err
}

// recordedVolumes lists the volumes with a loop record in stateDir.
func recordedVolumes(stateDir string) ([]string, error) {
	records, err := filepath.Glob(filepath.Join(stateDir, "*"+deviceSuffix))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, r := range records {
		if id := strings.TrimSuffix(filepath.Base(r), deviceSuffix); validateVolumeID(id) == nil {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// RecordedLoopDevices lists the loop devices the records in stateDir (a
// node plugin's --state-dir) name that are still bound to the file they
// were recorded with, live or gone: what a host's teardown must detach
// even where the kernel no longer names the file ("/disk").
func RecordedLoopDevices(stateDir string) []string {
	ids, _ := recordedVolumes(stateDir)
	var out []string
	for _, id := range ids {
		line, err := readRecord(filepath.Join(stateDir, id+deviceSuffix))
		if err != nil {
			continue
		}
		device, want, err := parseRecord(line)
		if err != nil {
			continue
		}
		backing, bound, err := loopBacking(device)
		if err != nil || !bound {
			continue
		}
		if ours, _, _ := boundToRecordedFile(device, backing, want); ours {
			out = append(out, device)
		}
	}
	return out
}

// ReleaseStale detaches, at the plugin's start, every recorded loop device
// left on the file of an instance manager that is gone and that nothing
// uses any more (its claim was unstaged while the plugin was away, or the
// unstage could not detach it). One still mounted stays for its unstage.
func (c *FileLoop) ReleaseStale(ctx context.Context) error {
	ids, err := recordedVolumes(c.Fallback.stateDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, volumeID := range ids {
		if err := c.releaseStale(ctx, volumeID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *FileLoop) releaseStale(ctx context.Context, volumeID string) error {
	defer c.locks.lock(volumeID)()
	_, stale, err := c.loops(volumeID)
	if err != nil || stale.device == "" {
		return err
	}
	if err := checkUnused(volumeID, stale.device); err != nil {
		c.log.WithError(err).WithField("device", stale.device).Info("nbddev: a loop device on a gone instance manager's file is still in use; its unstage will detach it")
		return nil
	}
	return c.detachStale(ctx, volumeID, stale)
}

// fileID is the device and inode numbers of a loop device's backing file.
type fileID struct{ dev, ino uint64 }

func loopFileID(loop string) (fileID, error) {
	f, err := os.Open(loop)
	if err != nil {
		return fileID{}, err
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return fileID{}, fmt.Errorf("%s: LOOP_GET_STATUS64: %w", loop, err)
	}
	return fileID{dev: info.Device, ino: info.Inode}, nil
}

// boundToRecordedFile tells whether device (bound to backing, as sysfs
// names it) is still on the file a record gave the numbers of. Once the
// instance manager that served the file is gone, its FUSE connection is
// dead and LOOP_GET_STATUS64, which stats the file, fails with ENOTCONN:
// the numbers cannot be read again. The kernel then names the file
// relative to its lost mount, "/disk": a device on a dead FUSE file of
// that name is taken as the recorded one (a device is only given out again
// once detached, and a detach removes its record). That case was how a
// loop device outlived its claim (issue 44): the check failed and the
// device was never detached.
func boundToRecordedFile(device, backing string, want fileID) (bool, fileID, error) {
	id, err := loopFileID(device)
	switch {
	case err == nil:
		return id == want, id, nil
	case errors.Is(err, unix.ENOTCONN):
		return backing == "/"+engineapi.FUSEFileName, id, err
	default:
		return false, id, err
	}
}

// staleLoop is a loop device still bound to the file it was recorded
// with, which is no longer the volume's live file.
type staleLoop struct{ device, backing string }

// loops finds volumeID's loop device: live, bound to its file now, or
// stale, bound to the file of an instance manager since gone.
func (c *FileLoop) loops(volumeID string) (live string, stale staleLoop, err error) {
	all, err := loopBackingFiles()
	if err != nil {
		return "", stale, fmt.Errorf("volume %s: listing loop devices: %w", volumeID, err)
	}
	return c.loopsIn(all, volumeID)
}

// loopsIn is loops on all, the loop devices by backing file.
func (c *FileLoop) loopsIn(all map[string]string, volumeID string) (live string, stale staleLoop, err error) {
	if dev, ok := all[c.file(volumeID)]; ok {
		return dev, stale, nil
	}
	line, err := readRecord(c.recordFile(volumeID))
	if err != nil || line == "" {
		return "", stale, err
	}
	device, want, err := parseRecord(line)
	if err != nil {
		c.log.WithField("record", c.recordFile(volumeID)).Warn("nbddev: ignoring an unreadable loop record")
		return "", stale, nil
	}
	// The recorded device is asked directly, not looked up in all: the
	// files of every instance manager killed on this node read "/disk"
	// once their mounts are gone, so by backing file one would hide the
	// others, and their devices would be left bound.
	backing, bound, err := loopBacking(device)
	if err != nil || !bound {
		return "", stale, err
	}
	// A live file of another volume is never this one's stale loop, even
	// if the numbers of a freed mount were given out again.
	if strings.HasPrefix(backing, c.fileDir+"/") {
		return "", stale, nil
	}
	ours, id, err := boundToRecordedFile(device, backing, want)
	if ours {
		return "", staleLoop{device: device, backing: backing}, nil
	}
	// Not this volume's (a number given out again), or it cannot tell: said,
	// since the device then stays bound until something else detaches it.
	c.log.WithFields(logrus.Fields{"volume": volumeID, "device": device, "backing": backing, "recorded": want,
		"found": id, "error": err}).Warn("nbddev: the recorded loop device is not this volume's stale one")
	return "", stale, nil
}

// fileSize is the file's size as its server says now: FUSE caches
// attributes, and AT_STATX_FORCE_SYNC asks past the cache.
func fileSize(path string) (int64, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_STATX_FORCE_SYNC, unix.STATX_SIZE, &st); err != nil {
		return 0, fmt.Errorf("reading the size of %s: %w", path, err)
	}
	return int64(st.Size), nil
}

// Disconnect detaches the loop device on the volume's file (the instance
// manager unmounts the file when the frontend stops) and whatever Fallback
// holds of the volume.
func (c *FileLoop) Disconnect(ctx context.Context, volumeID string) error {
	if err := validateVolumeID(volumeID); err != nil {
		return err
	}
	if err := c.disconnectFile(ctx, volumeID); err != nil {
		return err
	}
	return c.Fallback.Disconnect(ctx, volumeID)
}

func (c *FileLoop) disconnectFile(ctx context.Context, volumeID string) error {
	defer c.locks.lock(volumeID)()
	live, stale, err := c.loops(volumeID)
	if err != nil {
		return err
	}
	if stale.device != "" {
		return c.detachStale(ctx, volumeID, stale)
	}
	if live != "" {
		if err := checkUnused(volumeID, live); err != nil {
			return err
		}
		if err := detachLoop(ctx, volumeID, live, c.file(volumeID)); err != nil {
			return err
		}
		c.log.WithFields(logrus.Fields{"volume": volumeID, "device": live}).Info("nbddev: disconnected from the instance manager's file")
	}
	return removeIfExists(c.recordFile(volumeID))
}

// Device is the volume's loop device, on a live file or a gone one, else
// Fallback's.
func (c *FileLoop) Device(volumeID string) (string, bool, error) {
	if err := validateVolumeID(volumeID); err != nil {
		return "", false, err
	}
	live, stale, err := c.loops(volumeID)
	if err != nil {
		return "", false, err
	}
	if dev := live + stale.device; dev != "" {
		return dev, true, nil
	}
	return c.Fallback.Device(volumeID)
}

// Connected lists the loop devices on instance manager files (live or
// recorded), and Fallback's connections.
func (c *FileLoop) Connected() (map[string]string, error) {
	volumes, err := c.Fallback.Connected()
	if err != nil {
		return nil, err
	}
	recorded, err := recordedVolumes(c.Fallback.stateDir)
	if err != nil {
		return nil, err
	}
	loops, err := loopBackingFiles()
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, id := range recorded {
		ids[id] = true
	}
	for backing := range loops {
		if id, ok := engineapi.FUSEFileVolume(c.fileDir, backing); ok {
			ids[id] = true
		}
	}
	for id := range ids {
		if validateVolumeID(id) != nil {
			continue
		}
		if live, stale, err := c.loopsIn(loops, id); err == nil && live+stale.device != "" {
			volumes[id] = live + stale.device
		}
	}
	return volumes, nil
}

// Resize grows the loop device to the file's size, which FORCE_SYNC reads
// from the engine.
func (c *FileLoop) Resize(ctx context.Context, volumeID string) (int64, error) {
	size, fallback, err := c.resize(volumeID)
	if fallback {
		return c.Fallback.Resize(ctx, volumeID)
	}
	return size, err
}

func (c *FileLoop) resize(volumeID string) (size int64, fallback bool, err error) {
	defer c.locks.lock(volumeID)()
	live, stale, err := c.loops(volumeID)
	switch {
	case err != nil:
		return 0, false, err
	case stale.device != "":
		return 0, false, fmt.Errorf("volume %s: %s is on the file of an instance manager that is gone; restage the volume", volumeID, stale.device)
	case live == "":
		return 0, true, nil
	}
	have, err := deviceSize(live)
	if err != nil {
		return 0, false, err
	}
	want, err := fileSize(c.file(volumeID))
	if err != nil {
		return 0, false, fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if want <= have {
		return have, false, nil
	}
	got, err := growLoop(volumeID, live, want)
	if err != nil {
		return 0, false, err
	}
	if got < want {
		return got, false, fmt.Errorf("volume %s: %s grew to %d bytes, not %d", volumeID, live, got, want)
	}
	c.log.WithFields(logrus.Fields{"volume": volumeID, "device": live, "from": have, "to": got}).Info("nbddev: device grown")
	return got, false, nil
}
