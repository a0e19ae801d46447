// Package s3server runs versitygw, an S3-compatible server on a local
// directory, on loopback: the real S3 server the backup tests and the local
// cluster use. scripts/build-tools.sh builds the pinned versitygw into a
// cache outside the clone.
package s3server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Server is one running versitygw.
type Server struct {
	// Endpoint is http://127.0.0.1:<port>.
	Endpoint             string
	AccessKey, SecretKey string
	// Dir holds the buckets (data/) and versitygw's IAM files (iam/).
	Dir string

	bin, addr string
	logPath   string
	cmd       *exec.Cmd
	done      chan error
}

// Binary returns versitygw from the build cache, building it (once, a few
// minutes cold) with scripts/build-tools.sh of the repository at repoRoot.
func Binary(ctx context.Context, repoRoot string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot, "scripts", "build-tools.sh"), "versitygw")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building versitygw: %w", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "versitygw"), nil
}

// Start runs bin on a free loopback port with its data and IAM under dir
// (created), with fresh root credentials, and waits until it answers.
func Start(bin, dir string) (*Server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &Server{Endpoint: "http://" + addr, AccessKey: "strata" + randomHex(6), SecretKey: randomHex(20),
		Dir: dir, bin: bin, addr: addr, logPath: filepath.Join(dir, "versitygw.log")}
	for _, d := range []string{"data", "iam"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	return s, s.start()
}

// start runs the process at s's address (again, after Stop).
func (s *Server) start() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, "--port", s.addr, "--iam-dir", filepath.Join(s.Dir, "iam"),
		"posix", filepath.Join(s.Dir, "data"))
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+s.AccessKey, "ROOT_SECRET_KEY="+s.SecretKey)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, and killed with the process that started it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting versitygw: %w", err)
	}
	s.cmd, s.done = cmd, make(chan error, 1)
	go func() { s.done <- cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("versitygw exited at start (%v); its log: %s", err, s.logTail())
		default:
		}
		if c, err := net.DialTimeout("tcp", s.addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = s.Stop()
	return fmt.Errorf("versitygw did not listen on %s within 30s; its log: %s", s.addr, s.logTail())
}

// Restart starts a stopped server again on the same address and directory.
// Pid is the server process's, or 0 when it is not running.
func (s *Server) Pid() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

func (s *Server) Restart() error { return s.start() }

// Stop kills the server (SIGKILL: what a crash looks like to clients) and
// waits for it; stopping a stopped server does nothing.
func (s *Server) Stop() error {
	if s.cmd == nil {
		return nil
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	err := <-s.done
	s.cmd = nil
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return nil // killed, as asked
	}
	return err
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
