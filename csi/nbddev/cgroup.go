package nbddev

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// daemonCgroupName is the cgroup nbdfuse daemons move to, beside the
// kubelet's kubepods cgroup.
const daemonCgroupName = "strata-nbdfuse"

// moveToDaemonCgroup moves pid out of the plugin container's cgroup into
// daemonCgroupName beside kubepods, in every hierarchy of the cgroup
// filesystem at root (the host's /sys/fs/cgroup, mounted into the
// container): stopping a container kills every process of its cgroup,
// hostPID or not, and nbdfuse must outlive a plugin restart or upgrade, or
// the volume's filesystem gets I/O errors. selfCgroup is /proc/self/cgroup's
// content (where kubepods sits).
func moveToDaemonCgroup(root, selfCgroup string, pid int) error {
	paths := cgroupPaths(selfCgroup)
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil { // v2: one hierarchy
		return joinCgroup(root, filepath.Join(root, besideKubepods(paths[""]), daemonCgroupName), pid)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("cgroup filesystem %s: %w", root, err)
	}
	var errs []error
	moved := 0
	for _, e := range entries {
		h := filepath.Join(root, e.Name())
		// Skip the symlinks (cpu -> cpu,cpuacct) and what is no hierarchy.
		if e.Type()&fs.ModeSymlink != 0 || !e.IsDir() || !fileExists(filepath.Join(h, "cgroup.procs")) {
			continue
		}
		errs = append(errs, joinCgroup(h, filepath.Join(h, besideKubepods(paths[e.Name()]), daemonCgroupName), pid))
		moved++
	}
	if moved == 0 {
		return fmt.Errorf("no cgroup hierarchy under %s", root)
	}
	return errors.Join(errs...)
}

// cgroupPaths maps each v1 hierarchy's mount name (its controllers, or
// name=X's X) to the process's path in it; "" is the v2 path.
func cgroupPaths(selfCgroup string) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(selfCgroup))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		out[strings.TrimPrefix(parts[1], "name=")] = parts[2]
	}
	return out
}

// besideKubepods is the parent of the first kubepods element of a cgroup
// path (kubepods, kubepods.slice): the kubelet's cgroup root. A path
// without one (a private cgroup namespace shows "/") gives the root.
func besideKubepods(path string) string {
	elems := strings.Split(strings.Trim(path, "/"), "/")
	for i, e := range elems {
		if strings.HasPrefix(e, "kubepods") {
			return "/" + strings.Join(elems[:i], "/")
		}
	}
	return "/"
}

// joinCgroup makes dir (under hierarchy h) and moves pid into it. A new
// cpuset cgroup takes no task until it has CPUs and memory nodes: it gets
// its parent's.
func joinCgroup(h, dir string, pid int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making cgroup %s: %w", dir, err)
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		mine, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || strings.TrimSpace(string(mine)) != "" {
			continue
		}
		for parent := filepath.Dir(dir); strings.HasPrefix(parent, h); parent = filepath.Dir(parent) {
			if v, err := os.ReadFile(filepath.Join(parent, f)); err == nil && strings.TrimSpace(string(v)) != "" {
				_ = os.WriteFile(filepath.Join(dir, f), v, 0)
				break
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("moving process %d into cgroup %s: %w", pid, dir, err)
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
