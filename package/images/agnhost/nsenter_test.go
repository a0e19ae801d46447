package main

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
)

// PID 1's mount namespace entry is replaced by PID 2's only where it cannot
// be opened for lack of permission (this sandbox's init) and PID 2's can;
// other arguments, and the command's after "--", stay as they are.
func TestMountNSFallback(t *testing.T) {
	args := []string{"--mount=/rootfs/proc/1/ns/mnt", "--", "sh", "-c", "--mount=/rootfs/proc/1/ns/mnt"}
	denied := func(path string) error {
		if path == "/rootfs/proc/1/ns/mnt" {
			return fs.ErrPermission
		}
		return nil
	}
	assert.Equal(t, []string{"--mount=/rootfs/proc/2/ns/mnt", "--", "sh", "-c", "--mount=/rootfs/proc/1/ns/mnt"},
		mountNSFallback(args, denied))
	assert.Equal(t, args, mountNSFallback(args, func(string) error { return nil }), "PID 1's opens: unchanged")
	assert.Equal(t, args, mountNSFallback(args, func(string) error { return fs.ErrNotExist }), "another error: unchanged")
	assert.Equal(t, args, mountNSFallback(args, func(string) error { return fs.ErrPermission }), "PID 2's denied too: unchanged")
	other := []string{"--mount=/proc/7/ns/mnt", "--", "true"}
	assert.Equal(t, other, mountNSFallback(other, denied))
}
