package localcluster

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/strata-storage/strata/csi/nbddev"
	"github.com/strata-storage/strata/internal/mountinfo"

	"github.com/sirupsen/logrus"
)

const (
	teardownWait = 15 * time.Second // for killed processes to go and cgroups to empty
	// shimSocketDir is where containerd 2 puts its shims' sockets, whatever
	// its configuration says.
	shimSocketDir = "/run/containerd/s"
)

// teardown removes everything the node made, including what an earlier run
// in the same directory left (its processes found by their command lines).
// Kubelet would leave Pods running and volumes mounted when stopped, so this
// does not ask it to drain: it ends every process, then undoes the mounts,
// cgroups, loop devices and log links. Logs under Dir/logs are kept.
func (n *Node) teardown() error {
	if n.kubelet != nil {
		_ = n.kubelet.Stop(kubeletStopTimeout)
	}
	shimSockets := n.shimSockets()
	// Recorded before the mounts go: a loop device on a file inside a FUSE
	// mount (a CSI volume's NBD export) shows a dangling path once that
	// mount is detached.
	loops := n.loopDevices()
	var errs []error
	if err := n.killAll(); err != nil {
		errs = append(errs, err)
	}
	if n.containerd != nil {
		_ = n.containerd.Stop(stopTimeout)
	}
	for _, s := range shimSockets {
		if err := os.Remove(s); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	removeIfEmpty(shimSocketDir)
	removeIfEmpty(filepath.Dir(shimSocketDir))
	errs = append(errs, unmountUnder(n.Dir), detachLoopDevices(loops), n.removeCgroups(), n.removeLogLinks(),
		n.removeCNIResults(), removeSharedKubeletFiles())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Container images and Pod data go; logs stay for whoever debugs the run.
	entries, _ := os.ReadDir(n.Dir)
	for _, e := range entries {
		if e.Name() != "logs" {
			if err := os.RemoveAll(n.path(e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	n.log.Debug("node torn down")
	return errors.Join(errs...)
}

// nodeProcesses lists the processes that belong to the node: those in its
// cgroups (containers) and those whose command line names its directory
// (kubelet, containerd, shims — also an earlier run's).
func (n *Node) nodeProcesses() []int {
	pids := map[int]bool{}
	hierarchies, _ := cgroupHierarchies()
	for _, h := range hierarchies {
		_ = filepath.WalkDir(filepath.Join(h, n.cgroupRoot), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			for _, pid := range readPids(filepath.Join(path, "cgroup.procs")) {
				pids[pid] = true
			}
			return nil
		})
	}
	for pid, cmdline := range processCmdlines() {
		if strings.Contains(cmdline, n.Dir+"/") {
			pids[pid] = true
		}
	}
	delete(pids, os.Getpid())
	out := make([]int, 0, len(pids))
	for pid := range pids {
		out = append(out, pid)
	}
	sort.Ints(out)
	return out
}

// killAll sends SIGKILL to the node's processes until none is left.
func (n *Node) killAll() error {
	deadline := time.Now().Add(teardownWait)
	for {
		pids := n.nodeProcesses()
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still running after SIGKILL: %v", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shimSockets finds the sockets the node's shims listen on, by matching the
// socket inodes the shims hold against /proc/net/unix. A shim removes its own
// socket when it exits cleanly, but teardown kills it.
func (n *Node) shimSockets() []string {
	byInode := map[string]string{}
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 8 && strings.HasPrefix(fields[7], shimSocketDir+"/") {
			byInode[fields[6]] = fields[7]
		}
	}
	var out []string
	for pid, cmdline := range processCmdlines() {
		if !strings.Contains(cmdline, "containerd-shim") || !strings.Contains(cmdline, n.Dir+"/") {
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err != nil || !strings.HasPrefix(target, "socket:[") {
				continue
			}
			if path, ok := byInode[strings.Trim(target, "socket:[]")]; ok {
				out = append(out, path)
			}
		}
	}
	return out
}

// unmountUnder detaches every mount at or below dir, deepest first, until
// none is left (kubelet bind-mounts its root onto itself, so a path can
// carry more than one mount).
func unmountUnder(dir string) error {
	for range 10 {
		mounts := MountsUnder(dir)
		if len(mounts) == 0 {
			return nil
		}
		sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
		for _, m := range mounts {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
				logrus.WithError(err).WithField("mount", m).Warn("unmount failed")
			}
		}
	}
	if left := MountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("mounts left under %s: %v", dir, left)
	}
	return nil
}

// MountsUnder lists the mount points at or below dir, from mountinfo.
func MountsUnder(dir string) []string {
	var out []string
	for _, m := range MountPoints() {
		if m == dir || strings.HasPrefix(m, dir+"/") {
			out = append(out, m)
		}
	}
	return out
}

// MountPoints lists this mount namespace's mount points.
func MountPoints() []string {
	entries, err := mountinfo.Read()
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.MountPoint)
	}
	return out
}

// LoopDevices maps each attached loop device to its backing file.
func LoopDevices() map[string]string {
	out := map[string]string{}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			out["/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f)))] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// loopDevices lists the loop devices on the node's files (raw block volumes
// and the CSI plugin's NBD exports are attached through loop devices).
//
// A device on the file of an instance manager that is gone names no path
// under the node ("/disk", relative to its lost mount), so the node
// plugin's records (deployed: <hostDir>/csi; process mode: csi-state) are
// read too: they say which devices are bound to which file.
func (n *Node) loopDevices() []string {
	devices := LoopDevicesOn(func(file string) bool { return strings.HasPrefix(file, n.Dir+"/") })
	for _, stateDir := range []string{filepath.Join(n.StrataDir(), "csi"), n.CSIStateDir()} {
		for _, dev := range nbddev.RecordedLoopDevices(stateDir) {
			if !slices.Contains(devices, dev) {
				devices = append(devices, dev)
			}
		}
	}
	return devices
}

// LoopDevicesOn lists the loop devices whose backing file matches.
func LoopDevicesOn(match func(file string) bool) []string {
	var out []string
	for dev, file := range LoopDevices() {
		if match(file) {
			out = append(out, dev)
		}
	}
	return out
}

// detachLoopDevices detaches the given loop devices, once whatever was
// mounted from them is gone.
func detachLoopDevices(devices []string) error {
	var errs []error
	for _, dev := range devices {
		if _, err := os.Stat("/sys/block/" + filepath.Base(dev) + "/loop"); err != nil {
			continue // detached already (autoclear)
		}
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("losetup -d %s: %w: %s", dev, err, out))
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes the node's cgroup subtree in every hierarchy,
// deepest first. A cgroup whose last process just died may stay busy a
// moment, so it is retried.
func (n *Node) removeCgroups() error {
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(teardownWait)
	for _, h := range hierarchies {
		root := filepath.Join(h, n.cgroupRoot)
		for {
			err := removeCgroupTree(root)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func removeCgroupTree(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- { // children before parents
		if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("rmdir %s: %w", dirs[i], err)
		}
	}
	return nil
}

// kubeletLogLinkDir is where kubelet links every container's log, a path
// fixed in kubelet whatever its root or podLogsDir.
const kubeletLogLinkDir = "/var/log/containers"

// removeLogLinks removes the links kubelet made in /var/log/containers to
// this node's Pod logs; kubelet removes them only when it removes the
// container, which a teardown does not wait for.
func (n *Node) removeLogLinks() error {
	entries, err := os.ReadDir(kubeletLogLinkDir)
	if err != nil {
		return nil // kubelet never made it
	}
	var errs []error
	for _, e := range entries {
		link := filepath.Join(kubeletLogLinkDir, e.Name())
		if target, err := os.Readlink(link); err == nil && strings.HasPrefix(target, n.path("pod-logs")+"/") {
			if err := os.Remove(link); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// cniResultDir is where the CNI library caches each ADD's result, a path
// fixed in it; the entry goes with the DEL that a teardown never sends.
const cniResultDir = "/var/lib/cni/results"

// removeCNIResults removes the cached CNI results of this node's Pods,
// recognised by their network namespace path, which is under the node
// directory.
func (n *Node) removeCNIResults() error {
	entries, err := os.ReadDir(cniResultDir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(cniResultDir, e.Name())
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), n.Dir+"/") {
			if err := os.Remove(path); err != nil {
				errs = append(errs, err)
			}
		}
	}
	removeIfEmpty(cniResultDir)
	removeIfEmpty(filepath.Dir(cniResultDir))
	return errors.Join(errs...)
}

// kubeletDevicePluginSocket is the device manager's socket, at a path fixed
// in kubelet whatever its root: every kubelet on the machine binds it in
// turn. No Strata node uses device plugins, so it is only removed, once no
// kubelet is left running (another cluster's may be).
const kubeletDevicePluginSocket = "/var/lib/kubelet/device-plugins/kubelet.sock"

func removeSharedKubeletFiles() error {
	if kubeletRunning() {
		return nil
	}
	if err := os.Remove(kubeletDevicePluginSocket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	removeIfEmpty(filepath.Dir(kubeletDevicePluginSocket))
	removeIfEmpty(filepath.Dir(filepath.Dir(kubeletDevicePluginSocket)))
	removeIfEmpty(kubeletLogLinkDir)
	return nil
}

// kubeletRunning reports whether any kubelet runs on the machine.
func kubeletRunning() bool {
	for _, cmdline := range processCmdlines() {
		if bin, _, _ := strings.Cut(cmdline, " "); filepath.Base(bin) == "kubelet" {
			return true
		}
	}
	return false
}

func removeIfEmpty(dir string) { _ = syscall.Rmdir(dir) }

func readPids(path string) []int {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// processCmdlines maps every live process to its command line (NULs as spaces).
func processCmdlines() map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && len(b) > 0 {
			out[pid] = strings.ReplaceAll(string(b), "\x00", " ")
		}
	}
	return out
}
