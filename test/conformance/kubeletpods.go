package conformance

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// KubeletPodsDir is where the suite looks for a Pod's directory on its node:
// the volumeMode suite's "should not mount / map unused volumes in a pod"
// lists /var/lib/kubelet/pods/<uid>/volumes and volumeDevices through a
// hostexec Pod (test/e2e/storage/testsuites/volumemode.go in v1.36.3; the
// path is written there, not taken from a flag: --kubelet-root-dir only
// rewrites the manifests of the suite's own driver deployments,
// test/e2e/storage/utils/deployment.go). The local cluster's three kubelets
// share one machine, so each has a root of its own and no single root can
// be /var/lib/kubelet; and where the directory is missing the check passes
// without looking (`test ! -d` succeeds, nothing is listed). PodDirLinks
// makes every Pod's directory appear there.
const KubeletPodsDir = "/var/lib/kubelet/pods"

// PodDirLinks keeps a symlink dir/<uid> -> <kubelet root>/pods/<uid> for
// every Pod directory of the given kubelet roots, polling, so that a check
// through dir sees the node's real directory, mounts included. Pod UIDs are
// unique, so the three nodes' Pods never collide; links of others (another
// run's) are left alone.
type PodDirLinks struct {
	dir     string
	roots   []string
	mu      sync.Mutex
	made    map[string]string // link -> target, the links this one made
	total   int               // links made since the start
	madeDir bool              // dir did not exist before
	stop    chan struct{}
	done    chan struct{}
}

// StartPodDirLinks makes dir if missing, syncs once and then every period
// until Stop.
func StartPodDirLinks(dir string, kubeletRoots []string, period time.Duration) (*PodDirLinks, error) {
	l := &PodDirLinks{dir: dir, roots: kubeletRoots, made: map[string]string{},
		stop: make(chan struct{}), done: make(chan struct{})}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, err
		}
		l.madeDir = true
	}
	if err := l.Sync(); err != nil {
		_ = l.removeLinks()
		return nil, err
	}
	go func() {
		defer close(l.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
				_ = l.Sync() // a Pod directory removed mid-read: the next pass
			}
		}
	}()
	return l, nil
}

// Sync links every Pod directory of the roots not linked yet and removes the
// links it made whose Pod directory is gone.
func (l *PodDirLinks) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, root := range l.roots {
		entries, err := os.ReadDir(filepath.Join(root, "pods"))
		if errors.Is(err, fs.ErrNotExist) {
			continue // a kubelet that has run no Pod yet
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			link, target := filepath.Join(l.dir, e.Name()), filepath.Join(root, "pods", e.Name())
			if _, ours := l.made[link]; ours {
				continue
			}
			if _, err := os.Lstat(link); err == nil {
				continue // someone else's
			}
			if err := os.Symlink(target, link); err != nil {
				errs = append(errs, fmt.Errorf("linking %s: %w", link, err))
				continue
			}
			l.made[link] = target
			l.total++
		}
	}
	for link, target := range l.made {
		if _, err := os.Stat(target); errors.Is(err, fs.ErrNotExist) {
			if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
			delete(l.made, link)
		}
	}
	return errors.Join(errs...)
}

// Stop ends the polling and removes every link it made, and dir if it made
// it and nothing else is in it (the local cluster's teardown then removes
// /var/lib/kubelet once it is empty).
func (l *PodDirLinks) Stop() error {
	close(l.stop)
	<-l.done
	return l.removeLinks()
}

func (l *PodDirLinks) removeLinks() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for link := range l.made {
		if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		delete(l.made, link)
	}
	if l.madeDir {
		if err := os.Remove(l.dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("%s: %w (not empty: another run's links?)", l.dir, err))
		}
	}
	return errors.Join(errs...)
}

// Links is how many links it holds now, and has made since the start.
func (l *PodDirLinks) Links() (now, total int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.made), l.total
}
