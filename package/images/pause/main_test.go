package main

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunStopsOnTermAndInt(t *testing.T) {
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			sigs := make(chan os.Signal, 2)
			sigs <- syscall.SIGCHLD // reaped, not a reason to stop
			sigs <- sig
			assert.Equal(t, 0, run(sigs))
		})
	}
}

// A child started without anyone waiting for it stays a zombie until reap.
func TestReapCollectsZombies(t *testing.T) {
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "exit 3"}, &syscall.ProcAttr{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return procState(pid) == "Z" }, 5*time.Second, 10*time.Millisecond,
		"child did not become a zombie")
	reap()
	_, err = os.Stat("/proc/" + strconv.Itoa(pid))
	assert.True(t, os.IsNotExist(err), "zombie %d still there after reap", pid)
}

// procState is the state letter in /proc/<pid>/stat ("" if pid is gone).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// pid (comm) S ...; comm may hold spaces, so look after the last ')'.
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return string(b[i+2])
		}
	}
	return ""
}
