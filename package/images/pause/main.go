// Command pause is the local cluster's pod sandbox image: PID 1 of every
// Pod, holding its namespaces open. As PID 1 it inherits every orphaned
// process in the Pod, so it reaps them (or they would stay zombies until the
// Pod goes), and it must handle SIGTERM and SIGINT itself: the kernel drops
// signals PID 1 has no handler for, so without one the runtime would have to
// SIGKILL every sandbox.
//
// Built static (CGO_ENABLED=0) by package/images, so the image needs nothing
// else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	os.Exit(run(sigs))
}

// run reaps on every SIGCHLD until a SIGTERM or SIGINT, and returns the exit
// code: 0, as for Kubernetes' own pause, since stopping is the normal end.
func run(sigs <-chan os.Signal) int {
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		return 0
	}
	return 0
}

// reap collects every exited child. Signals coalesce, so one SIGCHLD can
// stand for several exits: loop until none is left.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
