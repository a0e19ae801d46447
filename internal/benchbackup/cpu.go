package benchbackup

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuUse is the CPU time (user and system) the processes of a run spent:
// the S3 server, the instance managers, and this process (the raw
// baselines' client). On a machine where they share the cores, a phase's
// throughput is bounded by its CPU per byte, so a backup against the raw
// PUT is bounded by the PUT's CPU over the backup's.
type cpuUse struct {
	server, managers, bench time.Duration
}

func (c cpuUse) total() time.Duration { return c.server + c.managers + c.bench }

func (c cpuUse) sub(o cpuUse) cpuUse {
	return cpuUse{c.server - o.server, c.managers - o.managers, c.bench - o.bench}
}

func (e *env) cpu() (cpuUse, error) {
	var c cpuUse
	var err error
	if c.server, err = processCPU(e.s3.Pid()); err != nil {
		return c, fmt.Errorf("CPU time of the S3 server: %w", err)
	}
	for _, im := range e.ims {
		d, err := processCPU(im.Pid())
		if err != nil {
			return c, fmt.Errorf("CPU time of instance manager %d: %w", im.Pid(), err)
		}
		c.managers += d
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return c, err
	}
	c.bench = time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
	return c, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go runs on (the kernel fixes it for user space).
const clockTicks = 100

// processCPU is utime+stime of every thread of pid, from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads fields 14 and 15 (utime, stime); the command name
// (field 2) is in parentheses and may hold spaces, so fields are counted
// after its closing one.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: %d fields after the name, want 13", stat, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat %q: %w", stat, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
