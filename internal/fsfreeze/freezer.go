// Package fsfreeze makes a snapshot hold what the application wrote: the
// CSI node plugin, which holds a volume's mount, freezes its filesystem
// (FIFREEZE: dirty data written out, new writes held) while the instance
// manager cuts the snapshot, then thaws it (FITHAW). A volume staged as a
// raw block device has no filesystem to freeze: its page cache is flushed
// (fsync of the device) instead. The instance manager asks over a unix
// socket (server.go); nothing here knows Kubernetes.
//
// A freeze must never outlive its snapshot: an application whose writes
// hang is worse than a crash-consistent snapshot. So
//   - a freeze is bounded: the caller's timeout covers FIFREEZE itself (a
//     filesystem whose device hangs never returns from it) and the time it
//     may stay frozen; a watchdog thaws it at the deadline, and a freeze
//     that returns after its caller gave up is thawed at once;
//   - a freeze is recorded on disk before FIFREEZE, and a plugin started
//     again (after kill -9) thaws every recorded mount before serving.
package fsfreeze

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/strata-storage/strata/internal/atomicfile"
	"github.com/strata-storage/strata/internal/mountinfo"
)

// Consistency says what a snapshot holds, as the instance manager records
// it in the snapshot's labels (ConsistencyLabel).
type Consistency string

const (
	// Filesystem: cut inside a freeze of the volume's mounted filesystem.
	Filesystem Consistency = "filesystem"
	// Flushed: a raw block device, its page cache flushed before the cut.
	Flushed Consistency = "flushed"
	// Crash: cut as a power cut would (not staged by the plugin, or the
	// freeze was turned off): what the application had not written out is
	// not in it.
	Crash Consistency = "crash"
)

// ConsistencyLabel is the snapshot label the instance manager sets.
const ConsistencyLabel = "strata.io/consistency"

// MaxTimeout bounds a freeze whatever the caller asks.
const MaxTimeout = 60 * time.Second

// ErrExpired: the freeze ended (watchdog, restart) before its thaw, so
// what was cut meanwhile may not be consistent.
var ErrExpired = errors.New("filesystem freeze expired before its thaw")

// ErrBusy: the volume is frozen for another cut.
var ErrBusy = errors.New("volume is frozen for another snapshot")

// FIFREEZE and FITHAW (linux/fs.h: _IOWR('X', 119/120, int)); x/sys/unix
// does not define them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// Target is what a volume is on this node.
type Target struct {
	MountPoint string // a mount point of its filesystem; "" if none
	Device     string // its block device; "" if not connected here
}

// Ops are the system calls a freeze makes; tests swap in a filesystem
// that hangs (real ones cannot be made to hang on demand).
type Ops struct {
	Freeze, Thaw func(mountPoint string) error
	Flush        func(device string) error
}

// SystemOps freeze, thaw and flush for real.
var SystemOps = Ops{Freeze: dirIoctl(ioctlFIFREEZE), Thaw: dirIoctl(ioctlFITHAW), Flush: flushDevice}

// Freezer freezes the volumes of one node.
type Freezer struct {
	// Resolve finds what a volume is on this node, from system state.
	resolve func(volume string) (Target, error)
	dir     string // freeze records, one file per frozen volume
	ops     Ops
	log     logrus.FieldLogger

	mu     sync.Mutex
	frozen map[string]*freeze // by volume
	// expired remembers freezes the watchdog ended, so their thaw says so.
	expired map[string]string // volume -> id
}

type freeze struct {
	ID         string `json:"id"`
	MountPoint string `json:"mountPoint"`
	timer      *time.Timer
	// hung: FIFREEZE has not returned and its caller gave up; whatever
	// comes of it, late settles it (Freeze).
	hung bool
}

// New returns a freezer keeping its records under stateDir.
func New(stateDir string, resolve func(string) (Target, error), ops Ops, log logrus.FieldLogger) *Freezer {
	return &Freezer{resolve: resolve, dir: stateDir, ops: ops, log: log.WithField("component", "fsfreeze"),
		frozen: map[string]*freeze{}, expired: map[string]string{}}
}

// Recover thaws every filesystem a record says is frozen: the process
// holding the freeze was killed. Call it before serving.
func (f *Freezer) Recover() error {
	entries, err := os.ReadDir(f.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading freeze records in %s: %w", f.dir, err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(f.dir, name)
		var rec freeze
		data, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("freeze record %s: %w", path, err))
			continue
		}
		if err := f.thawPath(rec.MountPoint); err != nil {
			errs = append(errs, err)
			continue
		}
		f.log.WithFields(logrus.Fields{"volume": strings.TrimSuffix(name, ".json"), "mountPoint": rec.MountPoint, "cut": rec.ID}).
			Warn("Thawed a filesystem left frozen by a process that stopped")
		_ = os.Remove(path)
	}
	return errors.Join(errs...)
}

// Freeze freezes (or flushes) volume for the cut id, for at most timeout:
// FIFREEZE must return within it, and the watchdog thaws at its end.
func (f *Freezer) Freeze(ctx context.Context, volume, id string, timeout time.Duration) (Consistency, error) {
	if timeout <= 0 || timeout > MaxTimeout {
		return "", fmt.Errorf("timeout %v: must be above 0 and at most %v", timeout, MaxTimeout)
	}
	if err := checkName("volume", volume); err != nil {
		return "", err
	}
	t, err := f.resolve(volume)
	if err != nil {
		return "", fmt.Errorf("volume %s: finding its mount: %w", volume, err)
	}
	switch {
	case t.Device == "":
		return Crash, nil
	case t.MountPoint == "":
		err := bounded(ctx, timeout, func() error { return f.ops.Flush(t.Device) }, nil, nil)
		if err != nil {
			return "", fmt.Errorf("volume %s: flushing %s: %w", volume, t.Device, err)
		}
		return Flushed, nil
	}
	f.mu.Lock()
	if cur := f.frozen[volume]; cur != nil {
		f.mu.Unlock()
		if cur.ID == id && !cur.hung {
			return Filesystem, nil // asked again: frozen already
		}
		return "", fmt.Errorf("volume %s (cut %s): %w", volume, cur.ID, ErrBusy)
	}
	fr := &freeze{ID: id, MountPoint: t.MountPoint}
	f.frozen[volume] = fr
	delete(f.expired, volume)
	f.mu.Unlock()

	if err := f.record(volume, fr); err != nil {
		f.forget(volume, fr)
		return "", err
	}
	// A freeze that returns after its caller gave up is thawed at once;
	// until then the volume stays busy, so no second freeze piles up.
	gaveUp := func() {
		f.mu.Lock()
		fr.hung = true
		f.mu.Unlock()
	}
	late := func(err error) {
		f.forget(volume, fr)
		if err != nil {
			f.dropRecord(volume)
			return
		}
		_ = f.thawAndDrop(volume, fr, "a freeze that finished after its caller gave up")
	}
	err = bounded(ctx, timeout, func() error { return f.ops.Freeze(t.MountPoint) }, gaveUp, late)
	if err != nil {
		if !f.isHung(fr) {
			f.forget(volume, fr)
			f.dropRecord(volume)
		}
		return "", fmt.Errorf("volume %s: freezing %s: %w", volume, t.MountPoint, err)
	}
	f.mu.Lock()
	if f.frozen[volume] == fr {
		fr.timer = time.AfterFunc(timeout, func() { f.expire(volume, fr) })
	}
	f.mu.Unlock()
	f.log.WithFields(logrus.Fields{"volume": volume, "mountPoint": t.MountPoint, "cut": id}).Debug("Froze filesystem")
	return Filesystem, nil
}

// Thaw ends volume's freeze for id. Thawing what is not frozen is
// success (a retry); ErrExpired says the watchdog thawed it first.
func (f *Freezer) Thaw(volume, id string) error {
	f.mu.Lock()
	fr := f.frozen[volume]
	if fr != nil && fr.hung {
		f.mu.Unlock()
		return nil // not frozen yet; it is thawed when FIFREEZE returns
	}
	if fr == nil || fr.ID != id {
		expired := f.expired[volume] == id
		f.mu.Unlock()
		if expired {
			return fmt.Errorf("volume %s (cut %s): %w", volume, id, ErrExpired)
		}
		return nil
	}
	delete(f.frozen, volume)
	if fr.timer != nil {
		fr.timer.Stop()
	}
	f.mu.Unlock()
	return f.thawAndDrop(volume, fr, "")
}

// ThawVolume ends any freeze of volume (before it is unstaged).
func (f *Freezer) ThawVolume(volume string) error {
	f.mu.Lock()
	fr := f.frozen[volume]
	f.mu.Unlock()
	if fr == nil {
		return nil
	}
	return f.Thaw(volume, fr.ID)
}

// expire is the watchdog: the freeze outlived its timeout.
func (f *Freezer) expire(volume string, fr *freeze) {
	f.mu.Lock()
	if f.frozen[volume] != fr {
		f.mu.Unlock()
		return
	}
	delete(f.frozen, volume)
	f.expired[volume] = fr.ID
	f.mu.Unlock()
	_ = f.thawAndDrop(volume, fr, "the freeze outlived its timeout")
}

// forget drops fr from the frozen set; false if it was not there.
func (f *Freezer) forget(volume string, fr *freeze) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen[volume] != fr {
		return false
	}
	delete(f.frozen, volume)
	return true
}

func (f *Freezer) thawAndDrop(volume string, fr *freeze, why string) error {
	err := f.thawPath(fr.MountPoint)
	if err == nil {
		f.dropRecord(volume)
	}
	log := f.log.WithFields(logrus.Fields{"volume": volume, "mountPoint": fr.MountPoint, "cut": fr.ID})
	switch {
	case err != nil:
		log.WithError(err).Error("Thawing a frozen filesystem failed; its record stays for the next start")
	case why != "":
		log.WithField("reason", why).Warn("Thawed a filesystem")
	default:
		log.Debug("Thawed filesystem")
	}
	return err
}

// thawPath thaws a mount point; one not frozen (EINVAL) or gone is fine.
func (f *Freezer) thawPath(mountPoint string) error {
	err := f.ops.Thaw(mountPoint)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("thawing %s: %w", mountPoint, err)
}

func (f *Freezer) recordPath(volume string) string { return filepath.Join(f.dir, volume+".json") }

func (f *Freezer) record(volume string, fr *freeze) error {
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return fmt.Errorf("freeze records: %w", err)
	}
	data, _ := json.Marshal(fr)
	if err := atomicfile.WriteFile(f.recordPath(volume), data); err != nil {
		return fmt.Errorf("recording the freeze of %s: %w", volume, err)
	}
	return nil
}

func (f *Freezer) dropRecord(volume string) { _ = os.Remove(f.recordPath(volume)) }

func (f *Freezer) isHung(fr *freeze) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fr.hung
}

// bounded runs fn for at most timeout (and ctx). If it gives up, gaveUp
// runs before it returns and late(fn's error) once fn returns; both may be
// nil.
func bounded(ctx context.Context, timeout time.Duration, fn func() error, gaveUp func(), late func(error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		err := fn()
		mu.Lock()
		defer mu.Unlock()
		if abandoned && late != nil {
			late(err)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		select {
		case err := <-done: // finished meanwhile
			return err
		default:
		}
		abandoned = true
		if gaveUp != nil {
			gaveUp()
		}
		return fmt.Errorf("no answer in %v: %w", timeout, ctx.Err())
	}
}

func checkName(field, v string) error {
	if v == "" || strings.ContainsAny(v, "/\x00") || v == "." || v == ".." {
		return fmt.Errorf("%s %q: must be a non-empty name without '/'", field, v)
	}
	return nil
}

func dirIoctl(req uint) func(string) error {
	return func(mountPoint string) error {
		fd, err := unix.Open(mountPoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: mountPoint, Err: err}
		}
		defer unix.Close(fd)
		if err := unix.IoctlSetInt(fd, req, 0); err != nil {
			return &os.PathError{Op: "ioctl", Path: mountPoint, Err: err}
		}
		return nil
	}
}

func flushDevice(device string) error {
	fd, err := unix.Open(device, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: device, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return &os.PathError{Op: "fsync", Path: device, Err: err}
	}
	return nil
}

// MountPointOf finds a mount point of the filesystem on device in this
// process's mount table ("" if it is not mounted).
func MountPointOf(device string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(device, &st); err != nil {
		return "", &os.PathError{Op: "stat", Path: device, Err: err}
	}
	want := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	entries, err := mountinfo.Read()
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if e.MajorMinor == want {
			return e.MountPoint, nil
		}
	}
	return "", nil
}
