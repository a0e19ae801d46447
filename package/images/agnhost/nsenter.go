package main

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// busybox is where the image's busybox is; its nsenter applet does the work.
const busybox = "/bin/busybox"

// nsenter stands in for busybox's nsenter in the agnhost image, where it
// comes first on PATH (/usr/local/bin/nsenter -> /agnhost). The storage
// suites run a command on a node through a privileged hostexec Pod that
// mounts the node's / at /rootfs: `nsenter --mount=/rootfs/proc/1/ns/mnt --
// sh -c CMD` (test/e2e/storage/utils/host_exec.go). On these machines PID 1
// is the sandbox's own init, whose /proc entries no process in another
// namespace may open, whatever its capabilities ("Permission denied"; the
// same from `unshare --cgroup` on the host). kthreadd, PID 2, lives in the
// same initial mount namespace and its entry opens, so the mount namespace
// is entered through it instead; anywhere PID 1's entry opens, nothing
// changes. The arguments then go to busybox's nsenter as they are.
func nsenter(args []string) int {
	args = mountNSFallback(args, func(path string) error {
		f, err := os.Open(path)
		if err == nil {
			f.Close()
		}
		return err
	})
	err := syscall.Exec(busybox, append([]string{"nsenter"}, args...), os.Environ())
	os.Stderr.WriteString("nsenter: exec " + busybox + ": " + err.Error() + "\n")
	return 127
}

// mountNSFallback replaces --mount=<root>/proc/1/ns/mnt with
// <root>/proc/2/ns/mnt when the first cannot be opened for lack of
// permission and the second can.
func mountNSFallback(args []string, open func(string) error) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		if a == "--" {
			break // the command's own arguments
		}
		path, ok := strings.CutPrefix(a, "--mount=")
		if !ok {
			continue
		}
		root, ok := strings.CutSuffix(path, "/proc/1/ns/mnt")
		if !ok || !errors.Is(open(path), fs.ErrPermission) {
			continue
		}
		if alt := root + "/proc/2/ns/mnt"; open(alt) == nil {
			out[i] = "--mount=" + alt
		}
	}
	return out
}
