package localcluster

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// kubeletKernelTunables are the sysctls kubelet sets at start when
// protectKernelDefaults is off (it refuses to start when it is on and they
// differ), so StopNodes puts back what the machine had.
var kubeletKernelTunables = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// kernelTunables maps a /proc/sys path to its value before any kubelet of
// the cluster started.
type kernelTunables map[string]string

// kernelTunablesFile keeps the record on disk, so that the teardown after a
// run killed with -9 still knows the machine's own values rather than the
// ones its kubelets left.
func (c *Cluster) kernelTunablesFile() string { return c.path(kubeletNodesDir, "kernel-tunables.json") }

// saveKernelTunables records the machine's values before the first kubelet
// starts. A record an earlier, crashed run left is kept: it holds the values
// from before that run.
func (c *Cluster) saveKernelTunables() error {
	if c.kernelTunables != nil {
		return nil
	}
	if saved, err := c.loadKernelTunables(); err != nil || saved != nil {
		c.kernelTunables = saved
		return err
	}
	saved := kernelTunables{}
	for _, name := range kubeletKernelTunables {
		v, err := os.ReadFile(filepath.Join("/proc/sys", name))
		if err != nil {
			continue // not in this kernel: kubelet will not set it either
		}
		saved[name] = string(v)
	}
	b, err := json.Marshal(saved)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.kernelTunablesFile()), 0o755); err != nil {
		return err
	}
	c.kernelTunables = saved
	return os.WriteFile(c.kernelTunablesFile(), b, 0o644)
}

// loadKernelTunables reads the record; nil without error when there is none.
func (c *Cluster) loadKernelTunables() (kernelTunables, error) {
	b, err := os.ReadFile(c.kernelTunablesFile())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	saved := kernelTunables{}
	return saved, json.Unmarshal(b, &saved)
}

// restoreKernelTunables writes the recorded values back once every kubelet
// is gone, then drops the record.
func (c *Cluster) restoreKernelTunables() error {
	saved := c.kernelTunables
	if saved == nil {
		var err error
		if saved, err = c.loadKernelTunables(); err != nil || saved == nil {
			return err
		}
	}
	var errs []error
	for name, v := range saved {
		path := filepath.Join("/proc/sys", name)
		if cur, err := os.ReadFile(path); err == nil && string(cur) == v {
			continue
		}
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.kernelTunables = nil
	if err := os.Remove(c.kernelTunablesFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
