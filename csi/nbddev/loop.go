package nbddev

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

const sysBlock = "/sys/block"

// loopBackingFiles maps the backing file of every bound loop device to the
// device ("/dev/loopN"). sysfs is the record that survives us: a loop device
// stays bound after the process that set it up is gone. Files that are gone
// can share a name (every dead FUSE export reads "/disk"): this map is for
// finding the device of a live file; ask a device with loopBacking.
func loopBackingFiles() (map[string]string, error) {
	paths, err := filepath.Glob(filepath.Join(sysBlock, "loop*", "loop", "backing_file"))
	if err != nil {
		return nil, err
	}
	loops := map[string]string{}
	for _, p := range paths {
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p)))
		backing, bound, err := loopBacking(dev)
		if err != nil {
			return nil, err
		}
		if bound {
			loops[backing] = dev
		}
	}
	return loops, nil
}

// loopBacking is the file device ("/dev/loopN") is bound to, if it is.
func loopBacking(device string) (string, bool, error) {
	backing, ok, err := readSysfs(filepath.Join(sysBlock, filepath.Base(device), "loop", "backing_file"))
	if err != nil || !ok || backing == "" {
		return "", false, err // unbound, or detached meanwhile
	}
	// The kernel appends " (deleted)" when the file was unlinked; the
	// device still belongs to that path as far as we are concerned.
	return strings.TrimSuffix(backing, " (deleted)"), true, nil
}

// loopDeviceFor returns the loop device whose backing file is file, if any.
func loopDeviceFor(file string) (string, bool, error) {
	loops, err := loopBackingFiles()
	if err != nil {
		return "", false, err
	}
	dev, ok := loops[file]
	return dev, ok, nil
}

// attachLoop binds a free loop device to file. Direct I/O keeps the data
// out of the page cache twice (once for the loop device, once for the file
// on FUSE) and makes a sync on the filesystem reach the export; if the
// kernel or the file refuses it, the buffered mode still works.
//
// The device ends at size: the file (the growable export) is larger.
func attachLoop(ctx context.Context, log logrus.FieldLogger, file string, size int64) (string, error) {
	limit := "--sizelimit=" + strconv.FormatInt(size, 10)
	dev, err := run(ctx, "losetup", "--find", "--show", "--direct-io=on", limit, file)
	if err == nil {
		return dev, nil
	}
	log.WithError(err).Warn("nbddev: losetup with direct I/O refused; retrying without")
	dev, err2 := run(ctx, "losetup", "--find", "--show", limit, file)
	if err2 != nil {
		return "", fmt.Errorf("attaching a loop device to %s: %v; without direct I/O: %w", file, err, err2)
	}
	return dev, nil
}

// checkUnused refuses a device that is mounted (a filesystem on it, or its
// node bind-mounted for a raw block volume) or held by another block device
// (device-mapper, md). Detaching it then would pull the disk out from under
// a filesystem.
func checkUnused(volumeID, device string) error {
	entries, err := readMountInfo()
	if err != nil {
		return err
	}
	points, err := mountPointsUsing(entries, device)
	if err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if len(points) > 0 {
		return fmt.Errorf("volume %s: device %s is still mounted at %s", volumeID, device, strings.Join(points, ", "))
	}
	holders, err := filepath.Glob(filepath.Join(sysBlock, filepath.Base(device), "holders", "*"))
	if err != nil {
		return err
	}
	if len(holders) > 0 {
		names := make([]string, len(holders))
		for i, h := range holders {
			names[i] = filepath.Base(h)
		}
		sort.Strings(names)
		return fmt.Errorf("volume %s: device %s is held by %s", volumeID, device, strings.Join(names, ", "))
	}
	return nil
}

// detachLoop unbinds device from file. If something still has the device
// open, the kernel only marks it for detaching on last close (autoclear) and
// losetup succeeds anyway; we wait for the binding to go, and fail otherwise
// so that the FUSE file under it is not unmounted while in use.
func detachLoop(ctx context.Context, volumeID, device, file string) error {
	if _, err := run(ctx, "losetup", "--detach", device); err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	gone := waitFor(5*time.Second, func() bool {
		backing, bound, err := loopBacking(device)
		return err == nil && (!bound || backing != file)
	})
	if !gone {
		return fmt.Errorf("volume %s: device %s is still open by some process; it will detach on last close (autoclear), retry then", volumeID, device)
	}
	return nil
}

// probeDevice reads the first 4 KiB of device past the page cache. An
// existing connection can be dead while every process and mount is still
// in place: nbdfuse stays up but fails every request once its server went
// away, even after the server is back. A read is the only proof it works.
func probeDevice(device string, timeout time.Duration) error {
	done := make(chan error, 1)
	// A read stuck on a hung server must not hang Connect; the goroutine
	// finishes whenever the read does.
	go func() { done <- readFirstBlock(device) }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("reading %s: no answer within %v", device, timeout)
	}
}

func readFirstBlock(device string) error {
	f, err := os.OpenFile(device, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// O_DIRECT needs an aligned buffer; an anonymous mapping is page-aligned.
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	if _, err := f.ReadAt(buf, 0); err != nil {
		return fmt.Errorf("reading %s: %w", device, err)
	}
	return nil
}
