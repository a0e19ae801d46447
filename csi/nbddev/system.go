package nbddev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// run runs a short command and returns its combined output. Its error names
// the command line and includes the output, which is where tools like
// losetup and qemu-nbd say what went wrong.
func run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		return text, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, text)
	}
	return text, nil
}

// readRecord reads a one-line state file; a missing file is "".
func readRecord(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// removeIfExists removes a file or empty directory; absence is success.
// Never RemoveAll: a directory that is still a mount point must not be
// descended into.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// logTail returns the last lines of a daemon's log for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	const max = 2048
	if len(b) > max {
		b = b[len(b)-max:]
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return "(log empty)"
	}
	return text
}

// process is a running program found in /proc.
type process struct {
	PID  int
	Args []string
}

// findProcesses returns the live processes whose command name is program
// and whose arguments satisfy match. Zombies are skipped: their cmdline is
// empty and they hold nothing.
func findProcesses(program string, match func(args []string) bool) ([]process, error) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var found []process
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue // exited meanwhile, kernel thread or zombie
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(args[0]) == program && match(args[1:]) {
			found = append(found, process{PID: pid, Args: args})
		}
	}
	return found, nil
}

// processGone reports whether pid has exited (or is a zombie, which has).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name, which may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// stopProcess waits up to selfExit for pid to exit on its own, then sends
// SIGTERM and, after grace, SIGKILL. nbdfuse exits by itself once its mount
// is gone (selfExit > 0 then); the signals are for one that is wedged, or
// that never mounted.
func stopProcess(pid int, selfExit, grace time.Duration) error {
	if waitFor(selfExit, func() bool { return processGone(pid) }) {
		return nil
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill -%d %d: %w", sig, pid, err)
		}
		if waitFor(grace, func() bool { return processGone(pid) }) {
			return nil
		}
	}
	return fmt.Errorf("process %d did not exit after SIGKILL", pid)
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readSysfs reads a sysfs attribute, trimmed; a missing one is "" and ok=false.
func readSysfs(path string) (string, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return string(bytes.TrimSpace(b)), true, nil
}
