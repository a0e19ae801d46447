package localcluster

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Restart backoff of supervised processes, as the kubelet's CrashLoopBackOff
// but shorter, since a developer is waiting: doubling from the first delay
// up to the cap, back to the first once a process has run for a while.
const (
	firstRestartDelay = time.Second
	maxRestartDelay   = 30 * time.Second
	stableRun         = time.Minute
)

// Supervisor keeps one simulated node's instance manager and manager
// running, as the kubelet keeps a DaemonSet's Pods: a process that exits is
// started again after a backoff, with the same disk and addresses (the
// instance manager keeps its ports, so the manager need not restart with
// it). Every restart is logged, and noted in the process's own log file.
type Supervisor struct {
	opts ManagerOptions
	log  logrus.FieldLogger

	mu       sync.Mutex
	m        *Manager
	restarts map[string]int // "manager" / "instance-manager" -> count
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// Supervise watches m (and m.IM) until StopAll.
func Supervise(log logrus.FieldLogger, opts ManagerOptions, m *Manager) *Supervisor {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Supervisor{opts: opts, log: log.WithField("node", m.Node), m: m, restarts: map[string]int{}, stop: cancel}
	s.wg.Go(func() { s.keepRunning(ctx, "manager", s.managerProcess, s.restartManager) })
	if m.IM != nil {
		s.wg.Go(func() { s.keepRunning(ctx, "instance-manager", s.imProcess, s.restartIM) })
	}
	return s
}

// Manager is the node's current manager (its IM field the current instance
// manager).
func (s *Supervisor) Manager() *Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m
}

// Restarts tells how often the manager or the instance manager was
// restarted ("manager", "instance-manager").
func (s *Supervisor) Restarts(component string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts[component]
}

// StopAll ends supervision, then stops the processes.
func (s *Supervisor) StopAll(timeout time.Duration) error {
	return s.Release().StopAll(timeout)
}

// Release ends supervision and hands back the node's current processes,
// which keep running.
func (s *Supervisor) Release() *Manager {
	s.stop()
	s.wg.Wait()
	return s.Manager()
}

func (s *Supervisor) managerProcess() *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Process
}

func (s *Supervisor) imProcess() *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.IM.Process
}

func (s *Supervisor) restartManager() (*Process, error) {
	s.mu.Lock()
	current := *s.m
	s.mu.Unlock()
	next, err := current.Restart(s.opts)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	next.IM = s.m.IM // the instance manager may have been restarted meanwhile
	s.m = next
	s.mu.Unlock()
	return next.Process, nil
}

func (s *Supervisor) restartIM() (*Process, error) {
	s.mu.Lock()
	prev, node := s.m.IM, s.m.Node
	s.mu.Unlock()
	im, err := StartInstanceManager(s.opts, node, prev)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.m.IM = im
	s.mu.Unlock()
	return im.Process, nil
}

// keepRunning waits for the component's process to exit and starts it
// again after the backoff, until ctx ends.
func (s *Supervisor) keepRunning(ctx context.Context, component string, current func() *Process, restart func() (*Process, error)) {
	delay := firstRestartDelay
	p := current()
	started := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.Done():
		}
		if time.Since(started) >= stableRun {
			delay = firstRestartDelay
		}
		log := s.log.WithFields(logrus.Fields{"process": p.Name, "pid": p.Pid(), "exit": fmt.Sprint(p.Err()),
			"log": p.LogPath, "restartIn": delay})
		log.Warn("process exited; restarting it")
		appendLine(p.LogPath, fmt.Sprintf("--- supervisor %s: %s (pid %d) exited (%v); restarting in %s",
			time.Now().Format(time.RFC3339), p.Name, p.Pid(), p.Err(), delay))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, maxRestartDelay)
			next, err := restart()
			if err == nil {
				p, started = next, time.Now()
				s.mu.Lock()
				s.restarts[component]++
				s.mu.Unlock()
				s.log.WithFields(logrus.Fields{"process": p.Name, "pid": p.Pid()}).Info("process restarted")
				break
			}
			log.WithError(err).Error("restart failed; trying again")
		}
	}
}

// appendLine adds one line to a log file; a failure only costs the note.
func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = fmt.Fprintln(f, line)
}
