// Command agnhost stands in for Kubernetes' e2e test image
// registry.k8s.io/e2e-test-images/agnhost (the entrypoint of that image,
// run with a subcommand as the Pod's args) in the local cluster, which
// cannot pull it: package/images builds it, static, into an image of
// Debian's busybox-static under the upstream name, and test/conformance
// imports that into the nodes. It serves the two subcommands the storage
// suites call (test/e2e/storage in k8s.io/kubernetes v1.36.3):
//
//   - pause: the default; sleeps until SIGTERM or SIGINT, reaping orphans
//     as a container's PID 1 must (the hostexec Pods the suites exec
//     nsenter in, and every exec Pod, run it);
//   - mounttest: the subPath suite's file checks, with the flags and the
//     output lines the suite matches ("content of file \"P\": …").
//
// Any other subcommand fails naming the two it has, so a suite that calls
// one more says so in its Pod's log rather than hanging. Run as nsenter (a
// link in the image) it enters a node's mount namespace for the hostexec
// Pods on these machines (nsenter.go).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	if filepath.Base(os.Args[0]) == "nsenter" {
		os.Exit(nsenter(os.Args[1:]))
	}
	args := os.Args[1:]
	if len(args) == 0 {
		args = []string{"pause"} // the upstream image's default command
	}
	switch args[0] {
	case "pause":
		sigs := make(chan os.Signal, 16)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
		os.Exit(pause(sigs))
	case "mounttest":
		os.Exit(mounttest(args[1:], os.Stdout, time.Sleep))
	default:
		fmt.Fprintf(os.Stderr, "agnhost: subcommand %q is not in this stand-in (it has pause and mounttest: package/images/agnhost)\n", args[0])
		os.Exit(2)
	}
}

// pause waits for SIGTERM or SIGINT and exits 0; as PID 1 it reaps every
// orphan handed to it on each SIGCHLD (the kernel drops a signal PID 1 has
// no handler for, so without these the runtime would SIGKILL it).
func pause(sigs <-chan os.Signal) int {
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return 0
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}
