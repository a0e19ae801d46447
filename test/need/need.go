// Package need is how a test says it needs a piece of the machine (root,
// a device, a tool): it skips when the piece is missing on a developer's
// machine, and fails under CI=true (.ci/run sets it), since CI must never
// pass by skipping. make test prints the skips with these reasons
// (scripts/test-times), so a skipped test is never silent either.
package need

import (
	"fmt"
	"os"
	"os/exec"
)

// TB is the part of testing.TB need uses.
type TB interface {
	Helper()
	Fatal(args ...any)
	Skip(args ...any)
}

// InCI reports whether the run is CI's (CI=true), where nothing skips.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing ends the test: skipped with the reason, or failed under CI=true.
func Missing(tb TB, format string, args ...any) {
	tb.Helper()
	why := fmt.Sprintf(format, args...)
	if InCI() {
		tb.Fatal("CI=true, and the test " + why)
		return
	}
	tb.Skip(why)
}

// That ends the test unless ok, with the reason (see Missing).
func That(tb TB, ok bool, format string, args ...any) {
	tb.Helper()
	if !ok {
		Missing(tb, format, args...)
	}
}

// Root needs the test to run as root, for what.
func Root(tb TB, what string) {
	tb.Helper()
	That(tb, os.Geteuid() == 0, "needs root (%s)", what)
}

// Tool needs the command on PATH, from the named Debian package.
func Tool(tb TB, command, debianPackage string) {
	tb.Helper()
	_, err := exec.LookPath(command)
	That(tb, err == nil, "needs %s (Debian package %s)", command, debianPackage)
}

// File needs path to exist (a device node such as /dev/fuse).
func File(tb TB, path string) {
	tb.Helper()
	_, err := os.Stat(path)
	That(tb, err == nil, "needs %s: %v", path, err)
}
