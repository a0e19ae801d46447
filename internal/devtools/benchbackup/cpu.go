package benchbackup

import (
	"fmt"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// cpuUse is the CPU time (user and system) the processes of a run spent:
// the S3 server, the instance managers, and this process with its
// children (the raw baselines' client, nbdcopy). On a machine where they
// share the cores, a phase's throughput is bounded by its CPU per byte, so
// a backup against the raw PUT is bounded by the PUT's CPU over the
// backup's.
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
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			return c, err
		}
		c.bench += time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
	}
	return c, nil
}

// timed runs fn and returns its wall time and the CPU every process spent
// meanwhile.
func (e *env) timed(fn func() error) (phase, error) {
	cpu0, err := e.cpu()
	if err != nil {
		return phase{}, err
	}
	start := time.Now()
	if err := fn(); err != nil {
		return phase{}, err
	}
	d := time.Since(start)
	cpu1, err := e.cpu()
	if err != nil {
		return phase{}, err
	}
	return phase{d: d, cpu: cpu1.sub(cpu0)}, nil
}

// processCPU is the user and system time of every thread of pid so far.
func processCPU(pid int) (time.Duration, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), nil
}
