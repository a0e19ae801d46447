package nbddev

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// exportSize asks the engine for the export's size now, with nbdinfo (the
// same libnbd as nbdfuse), on the plain export: it tells the real size.
func exportSize(ctx context.Context, endpoint string) (int64, error) {
	out, err := run(ctx, "nbdinfo", "--size", endpoint)
	if err != nil {
		return 0, fmt.Errorf("reading the size of %s: %w", endpoint, err)
	}
	size, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || size <= 0 {
		return 0, fmt.Errorf("reading the size of %s: nbdinfo said %q", endpoint, out)
	}
	return size, nil
}

// deviceSize is a block device's size in bytes, from sysfs.
func deviceSize(device string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(device), "size"))
	if err != nil {
		return 0, fmt.Errorf("reading the size of %s: %w", device, err)
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reading the size of %s: %w", device, err)
	}
	return sectors * 512, nil
}

// setLoopSizeLimit moves a bound loop device's end to size, in use or not.
// losetup cannot change the size limit of a bound device (only re-read the
// file's size), so this is the LOOP_SET_STATUS64 ioctl itself, which also
// updates the device's capacity.
func setLoopSizeLimit(device string, size int64) error {
	f, err := os.OpenFile(device, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", device, err)
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return fmt.Errorf("%s: LOOP_GET_STATUS64: %w", device, err)
	}
	info.Sizelimit = uint64(size)
	if err := unix.IoctlLoopSetStatus64(int(f.Fd()), info); err != nil {
		return fmt.Errorf("%s: LOOP_SET_STATUS64 (size limit %d): %w", device, size, err)
	}
	return nil
}

// growLoop moves a loop device's end to want bytes and returns its size
// after: less than want when its backing file is smaller.
func growLoop(volumeID, loop string, want int64) (int64, error) {
	if err := setLoopSizeLimit(loop, want); err != nil {
		return 0, fmt.Errorf("volume %s: %w", volumeID, err)
	}
	return deviceSize(loop)
}

// Resize grows the loop device to the export's size. The FUSE file is the
// growable export, so only the loop device's size limit moves.
func (c *FUSELoop) Resize(ctx context.Context, volumeID string) (int64, error) {
	defer c.locks.lock(volumeID)()
	st, err := c.inspect(volumeID)
	if err != nil {
		return 0, err
	}
	if !st.healthy() {
		return 0, fmt.Errorf("volume %s is not connected on this node (%v)", volumeID, stateFields(st))
	}
	want, err := exportSize(ctx, st.endpoint)
	if err != nil {
		return 0, fmt.Errorf("volume %s: %w", volumeID, err)
	}
	have, err := deviceSize(st.loop)
	if err != nil {
		return 0, err
	}
	if want <= have {
		return have, nil
	}
	got, err := growLoop(volumeID, st.loop, want)
	if err != nil {
		return 0, err
	}
	if got < want {
		// A connection made before the growable export existed: its file
		// ends at the old size. Restaging the volume fixes it.
		return got, fmt.Errorf("volume %s: %s grew to %d bytes, not %d: its connection predates online expansion; "+
			"restage the volume (restart the Pod)", volumeID, st.loop, got, want)
	}
	c.log.WithFields(map[string]any{"volume": volumeID, "device": st.loop, "from": have, "to": got}).Info("nbddev: device grown")
	return got, nil
}

// Resize grows the device to the export's size. The kernel nbd client
// learns a size only at connect (qemu-nbd cannot change it), so an expanded
// volume shows its new size once it is staged again.
func (c *KernelNBD) Resize(ctx context.Context, volumeID string) (int64, error) {
	dev, ok, err := c.Device(volumeID)
	if err != nil || !ok {
		return 0, fmt.Errorf("volume %s is not connected on this node: %v", volumeID, err)
	}
	endpoint, err := readRecord(c.endpointFile(volumeID))
	if err != nil {
		return 0, err
	}
	want, err := exportSize(ctx, endpoint)
	if err != nil {
		return 0, err
	}
	have, err := deviceSize(dev)
	if err != nil || have >= want {
		return have, err
	}
	return have, fmt.Errorf("volume %s: %s has %d bytes, the volume %d: the kernel nbd client cannot grow a connected device; "+
		"restage the volume (restart the Pod)", volumeID, dev, have, want)
}
