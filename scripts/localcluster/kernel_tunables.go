package localcluster

import (
	"errors"
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

type kernelTunables map[string][]byte

// saveKernelTunables records the machine's values before the first kubelet
// starts; later nodes of the same cluster keep the first record.
func (c *Cluster) saveKernelTunables() error {
	if c.kernelTunables != nil {
		return nil
	}
	saved := kernelTunables{}
	for _, name := range kubeletKernelTunables {
		v, err := os.ReadFile(filepath.Join("/proc/sys", name))
		if err != nil {
			continue // not in this kernel: kubelet will not set it either
		}
		saved[name] = v
	}
	c.kernelTunables = saved
	return nil
}

func (t kernelTunables) restore() error {
	var errs []error
	for name, v := range t {
		path := filepath.Join("/proc/sys", name)
		if cur, err := os.ReadFile(path); err == nil && string(cur) == string(v) {
			continue
		}
		if err := os.WriteFile(path, v, 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
