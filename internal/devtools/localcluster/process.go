package localcluster

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Process is a child process whose output goes to a log file. It runs in its
// own process group so Stop also reaches anything it forked, and it is killed
// by the kernel if the thread that started it dies (Pdeathsig), so a crashed
// test binary leaves no control plane behind.
type Process struct {
	Name    string
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed

	stopOnce sync.Once
	stopErr  error
}

// StartProcess starts bin with args, stdout and stderr both appended to
// logPath (its directory is created). The process outlives any context: only
// Stop or its own exit ends it.
func StartProcess(name, logPath, bin string, args ...string) (*Process, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// Closing our copy right after Start is safe: the child has its own.
	defer logFile.Close()

	cmd := exec.Command(bin, args...)
	// A file (not a pipe) as output means Wait never blocks on a grandchild
	// that still holds the pipe open.
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startOnSpawnerThread(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pdeathsig fires when the OS thread that forked the child exits, not the
// process. Go may end a thread (one whose goroutine locked it and returned),
// so every child is forked from one locked thread that never exits.
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func startOnSpawnerThread(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawnReqs {
				r.err <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnReqs <- r
	return <-r.err
}

// Pid is the process id, which is also its process group id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the exit error once Done is closed (nil for a clean exit).
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL if it has not exited
// within timeout. It fails only if the process cannot be ended; how it exited
// is Err's business. Calling Stop again returns the first result.
func (p *Process) Stop(timeout time.Duration) error {
	p.stopOnce.Do(func() { p.stopErr = p.stop(timeout) })
	return p.stopErr
}

func (p *Process) stop(timeout time.Duration) error {
	pgid := p.Pid()
	// Signal the group even if the leader is gone: a child it forked may be left.
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, pgid)
		}
	}
	// Whatever else is left in the group gets no grace period.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return nil
}

// LogTail returns the last n lines of the process log.
func (p *Process) LogTail(n int) string { return TailFile(p.LogPath, n) }

// TailFile returns the last n lines of a file (at most 16 KiB), or a note
// saying why it could not be read.
func TailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	const maxBytes = 16 << 10
	var off int64
	if fi, err := f.Stat(); err == nil && fi.Size() > maxBytes {
		off = fi.Size() - maxBytes
	}
	buf := make([]byte, maxBytes)
	m, _ := f.ReadAt(buf, off)
	lines := bytes.Split(bytes.TrimRight(buf[:m], "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago and that no earlier call of this process returned: a port handed to
// a process that binds it only later (a manager's webhook listener waits
// for its caches) is free again meanwhile, and the kernel may give it out
// anew (seen in CI: two managers given one port). The ports of one call are
// held open together so that none is handed out twice; another process may
// still take one before it is used, which Start retries on.
func FreePorts(n int) ([]int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 100*n {
			return nil, fmt.Errorf("no %d loopback ports this process has not handed out already, in %d tries", n, tries)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		if port := l.Addr().(*net.TCPAddr).Port; !handedOut.ports[port] {
			ports = append(ports, port)
		}
	}
	for _, p := range ports {
		handedOut.ports[p] = true
	}
	return ports, nil
}

// handedOut is every port FreePorts returned in this process.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}
