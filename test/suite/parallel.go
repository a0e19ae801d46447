// Package suite holds what the cluster test suites (test/e2e,
// test/deployed) share in their TestMain.
package suite

import (
	"flag"
	"strconv"
)

// DefaultParallel makes n the number of parallel tests that run at once,
// unless -parallel was given: the suites' tests mostly wait (for Pods,
// kubelets, uploads), so more than go test's default of one per core. Call
// it after flag.Parse. It sets the flag's value, not flag.Set: csi-sanity's
// Ginkgo refuses to run when it sees test.parallel set on the command line
// (it would not parallelize its specs), and only a set made through the
// flag set counts as one.
func DefaultParallel(n int) {
	p := flag.Lookup("test.parallel")
	if p == nil || wasSet("test.parallel") {
		return
	}
	_ = p.Value.Set(strconv.Itoa(n))
}

func wasSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
