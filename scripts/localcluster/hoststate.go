package localcluster

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// HostResidue lists what a cluster in dir has on the host outside its
// processes' memory: mounts and loop devices on its files, processes that
// name its directory or run in its cgroups, its cgroup directories, kubelet
// log links into it, and shim sockets nobody listens on. After Stop it must
// be empty; tests check exactly that. Everything is attributed to dir (paths
// under it, or its cgroup prefix), so clusters of other test packages running
// at the same time are not counted, with one exception: a stale shim socket
// cannot be traced back to its cluster, so any stale socket that was not in
// before is counted (pass the list StaleShimSockets gave before the start).
func HostResidue(dir string, staleSocketsBefore []string) []string {
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
	before := map[string]bool{}
	for _, s := range staleSocketsBefore {
		before[s] = true
	}
	for _, s := range StaleShimSockets() {
		if !before[s] {
			out = append(out, "stale shim socket: "+s)
		}
	}
	sort.Strings(out)
	return out
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
