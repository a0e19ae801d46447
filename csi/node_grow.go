package csi

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// growExtBeforeMount grows an ext2/3/4 filesystem that is smaller than its
// device (the volume was expanded while not staged) before it is mounted:
// offline growth needs no more than the device, where online growth needs
// CAP_SYS_RESOURCE as well, which a node plugin may lack. resize2fs wants
// a fresh e2fsck -f first. Not an ext filesystem, or nothing to grow:
// nothing done.
func growExtBeforeMount(ctx context.Context, device string) (grown bool, err error) {
	out, err := exec.CommandContext(ctx, "blkid", "-p", "-s", "TYPE", "-o", "value", device).Output()
	fsType := strings.TrimSpace(string(out))
	var exitErr *exec.ExitError
	if err != nil && !(errors.As(err, &exitErr) && exitErr.ExitCode() == 2) { // 2: nothing found (blank)
		return false, fmt.Errorf("blkid %s: %w", device, err)
	}
	switch fsType {
	case "ext2", "ext3", "ext4":
	default:
		return false, nil
	}
	fsBytes, err := extSize(ctx, device)
	if err != nil {
		return false, err
	}
	devBytes, err := blockDeviceSize(device)
	if err != nil {
		return false, err
	}
	if fsBytes >= devBytes {
		return false, nil
	}
	// e2fsck -p exits 1 when it fixed something, which is fine here.
	if out, err := exec.CommandContext(ctx, "e2fsck", "-f", "-p", device).CombinedOutput(); err != nil &&
		!(errors.As(err, &exitErr) && exitErr.ExitCode() == 1) {
		return false, fmt.Errorf("e2fsck -f -p %s: %w: %s", device, err, out)
	}
	if out, err := exec.CommandContext(ctx, "resize2fs", device).CombinedOutput(); err != nil {
		return false, fmt.Errorf("resize2fs %s: %w: %s", device, err, out)
	}
	return true, nil
}

// extSize is an ext filesystem's size in bytes, from its superblock.
func extSize(ctx context.Context, device string) (int64, error) {
	out, err := exec.CommandContext(ctx, "dumpe2fs", "-h", device).Output()
	if err != nil {
		return 0, fmt.Errorf("dumpe2fs -h %s: %w", device, err)
	}
	var blocks, blockSize int64
	for _, line := range strings.Split(string(out), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(key) {
		case "Block count":
			blocks, _ = strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		case "Block size":
			blockSize, _ = strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		}
	}
	if blocks <= 0 || blockSize <= 0 {
		return 0, fmt.Errorf("dumpe2fs -h %s: no block count or size in its output", device)
	}
	return blocks * blockSize, nil
}
