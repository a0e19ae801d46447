package localcluster

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// HostResidue lists what a cluster in dir has on the host outside its
// processes' memory: mounts and loop devices on its files, processes that
// name its directory or run in its cgroups, its cgroup directories, kubelet
// log links and cached CNI results that point into it, shim sockets nobody
// listens on, and the paths kubelet and containerd create outside their
// directories (/var/lib/kubelet, /var/lib/cni, /var/log/containers,
// /run/containerd). After Stop it must be empty; tests check exactly that.
// What can be attributed to dir (paths under it, its cgroup prefix) is, so
// clusters of other test packages running at the same time are not counted;
// a stale shim socket cannot be traced back to its cluster, so any that is
// not in before counts, and a shared path counts when it is not in before and
// no kubelet runs on the machine.
func HostResidue(dir string, before HostBaseline) []string {
	dir, _ = filepath.Abs(dir)
	var out []string
	for _, line := range mountinfoLines() {
		if strings.Contains(line, dir+"/") {
			out = append(out, "mount: "+line)
		}
	}
	for dev, file := range LoopDevices() {
		if strings.HasPrefix(file, dir+"/") {
			out = append(out, fmt.Sprintf("loop device: %s on %s", dev, file))
		} else if !strings.HasPrefix(file, "/") || !fileExists(file) {
			// Its file's mount is gone (a FUSE export detached under it):
			// whoever made it, it is left over, unless it was there before.
			if !slices.Contains(before.loopDevices, dev) {
				out = append(out, fmt.Sprintf("orphaned loop device: %s on %s", dev, file))
			}
		}
	}
	prefix := cgroupPrefix(dir)
	for pid, cmdline := range processCmdlines() {
		if pid != os.Getpid() && strings.Contains(cmdline, dir+"/") {
			out = append(out, fmt.Sprintf("process %d: %s", pid, cmdline))
		}
	}
	hierarchies, _ := cgroupHierarchies()
	for _, h := range hierarchies {
		cgroups, _ := filepath.Glob(filepath.Join(h, prefix+"*"))
		for _, cg := range cgroups {
			out = append(out, "cgroup: "+cg)
			for _, pid := range readPids(filepath.Join(cg, "cgroup.procs")) {
				out = append(out, fmt.Sprintf("process %d in cgroup %s", pid, cg))
			}
		}
	}
	links, _ := os.ReadDir(kubeletLogLinkDir)
	for _, l := range links {
		if target, err := os.Readlink(filepath.Join(kubeletLogLinkDir, l.Name())); err == nil && strings.HasPrefix(target, dir+"/") {
			out = append(out, "log link: "+l.Name()+" -> "+target)
		}
	}
	results, _ := os.ReadDir(cniResultDir)
	for _, r := range results {
		if b, err := os.ReadFile(filepath.Join(cniResultDir, r.Name())); err == nil && strings.Contains(string(b), dir+"/") {
			out = append(out, "CNI result: "+r.Name())
		}
	}
	for _, s := range StaleShimSockets() {
		if !slices.Contains(before.staleSockets, s) {
			out = append(out, "stale shim socket: "+s)
		}
	}
	// Paths that kubelet and containerd fix whatever their configuration;
	// while another cluster's kubelet runs they may be its own.
	if !kubeletRunning() {
		for _, path := range sharedNodePaths {
			if _, err := os.Lstat(path); err == nil && !slices.Contains(before.sharedPaths, path) {
				out = append(out, "shared path: "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// sharedNodePaths are the places outside a node directory that a kubelet or
// containerd creates; teardown removes them once they are empty.
var sharedNodePaths = []string{filepath.Dir(shimSocketDir), kubeletLogLinkDir, filepath.Dir(cniResultDir),
	filepath.Dir(filepath.Dir(kubeletDevicePluginSocket))}

// HostBaseline is what was on the host before a cluster started, for
// HostResidue to tell apart.
type HostBaseline struct {
	staleSockets []string
	sharedPaths  []string
	loopDevices  []string
}

// TakeHostBaseline records the stale shim sockets and the shared paths that
// exist before a cluster starts.
func TakeHostBaseline() HostBaseline {
	b := HostBaseline{staleSockets: StaleShimSockets()}
	for dev := range LoopDevices() {
		b.loopDevices = append(b.loopDevices, dev)
	}
	for _, path := range sharedNodePaths {
		if _, err := os.Lstat(path); err == nil {
			b.sharedPaths = append(b.sharedPaths, path)
		}
	}
	return b
}

// StaleShimSockets lists the sockets in containerd's shim directory that no
// process listens on: what a shim killed without cleanup leaves.
func StaleShimSockets() []string {
	files, _ := filepath.Glob(filepath.Join(shimSocketDir, "*"))
	if len(files) == 0 {
		return nil
	}
	listening := map[string]bool{}
	if f, err := os.Open("/proc/net/unix"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) >= 8 {
				listening[fields[7]] = true
			}
		}
		f.Close()
	}
	var out []string
	for _, file := range files {
		if !listening[file] {
			out = append(out, file)
		}
	}
	return out
}

func mountinfoLines() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// StopLeavingNothing stops c and says what went wrong, if anything: the
// stop's error, and what the kubelet nodes made under clusterDir that
// outlives the cluster (HostResidue against baseline). A test binary's
// TestMain fails on any of it.
func (c *Cluster) StopLeavingNothing(clusterDir string, baseline HostBaseline) []string {
	var reasons []string
	if err := c.Stop(); err != nil {
		reasons = append(reasons, fmt.Sprintf("stopping the cluster: %v", err))
	}
	if residue := HostResidue(clusterDir, baseline); len(residue) > 0 {
		reasons = append(reasons, fmt.Sprintf("left on the host after the cluster stopped:\n  %s", strings.Join(residue, "\n  ")))
	}
	return reasons
}
