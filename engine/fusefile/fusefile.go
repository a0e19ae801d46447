// Package fusefile serves a block device (a volume's engine) as one regular
// file through FUSE, for a loop device to sit on: the CSI node path on
// nodes without the kernel nbd module.
//
// Requests reach it over FUSE-over-io_uring queues (one per CPU) when the
// kernel offers them (Linux 6.14+, fuse.enable_uring=Y), else by reading
// /dev/fuse. Either way it asks for asynchronous direct I/O, without which
// the loop device's direct I/O reaches the server one request at a time,
// and serves each device request on its own goroutine.
//
// The FUSE side is written here rather than taken from a library because
// none available to us speaks FUSE over io_uring (libfuse 3.14 predates it;
// go-fuse has an open request, hanwen/go-fuse#560). Served beside the
// engine, ext4 on a loop device on this file got 0.63-0.87x of the raw NBD
// export for 4 KiB random reads, against 0.28-0.35x through nbdfuse
// (docs/bench-kbench.md). One file needs a dozen opcodes.
//
// Each queue is served by one OS thread that registers its entries,
// submits every command and waits in io_uring_enter: the kernel completes
// a FUSE command through task work of the thread that submitted it, so
// one thread must own each ring (as libfuse does). Device requests run on
// goroutines and come back to that thread through an eventfd.
package fusefile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"

	"github.com/strata-storage/strata/engine/blockdev"
)

// DefaultMaxWrite is the largest request; each io_uring entry holds one
// (its memory is touched only where requests land).
const DefaultMaxWrite = 1 << 20

// Options configure a Server.
type Options struct {
	// Name is the file's name in the mount directory; "disk" if empty.
	Name string
	// MaxWrite is the largest read or write request in bytes, a multiple
	// of 4096; DefaultMaxWrite if 0.
	MaxWrite int
	// Classic keeps to /dev/fuse reads even where io_uring is offered.
	Classic bool
	Log     logrus.FieldLogger
}

// Server is one mounted file.
type Server struct {
	dir, name string
	dev       blockdev.Device
	log       logrus.FieldLogger
	maxWrite  int
	classic   bool

	fd        int
	conn      uint64 // the connection's number: the mount's device minor
	connKnown bool
	readers   sync.WaitGroup // classic readers and request goroutines
	rings     *rings         // nil until INIT accepted io_uring
	failed    *rings         // queues that started before one failed to register; closed with the server
	buffers   *sync.Pool     // of *[]byte, maxWrite plus headers
	ready     chan error     // the INIT exchange's outcome
	closeMu   sync.Mutex
	closed    bool
}

// Mount mounts dir (an existing empty directory) as a FUSE file system of
// one file, Path(), whose bytes are dev's. It returns once the kernel has
// initialised the connection.
func Mount(dir string, dev blockdev.Device, opts Options) (*Server, error) {
	s := &Server{dir: dir, name: opts.Name, dev: dev, log: opts.Log, maxWrite: opts.MaxWrite, classic: opts.Classic,
		ready: make(chan error, 1)}
	if s.name == "" {
		s.name = "disk"
	}
	if s.maxWrite == 0 {
		s.maxWrite = DefaultMaxWrite
	}
	if s.maxWrite%4096 != 0 || s.maxWrite < 4096 || s.maxWrite > 1<<20 {
		return nil, fmt.Errorf("fusefile: max write %d: want a multiple of 4096 from 4096 to 1 MiB", s.maxWrite)
	}
	if s.log == nil {
		s.log = logrus.StandardLogger()
	}
	s.buffers = newBufferPool(s.maxWrite)
	s.log = s.log.WithField("fuse", filepath.Join(dir, s.name))
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fusefile: opening /dev/fuse: %w", err)
	}
	s.fd = fd
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", fd)
	if err := syscall.Mount("strata", dir, "fuse.strata", syscall.MS_NOSUID|syscall.MS_NODEV, data); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("fusefile: mounting %s: %w", dir, err)
	}
	// Two readers: INIT and, later, FORGETs and what comes before the
	// rings are up (or everything, without rings).
	for range 2 {
		s.readers.Go(s.readLoop)
	}
	if err := <-s.ready; err != nil {
		_ = s.Close()
		return nil, err
	}
	// The stat is served by the readers, so it comes after INIT.
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("fusefile: %s after mounting: %w", dir, err)
	}
	s.conn, s.connKnown = uint64(unix.Minor(st.Dev)), true
	s.log.WithField("io_uring", s.rings != nil).Info("FUSE file served")
	return s, nil
}

// Path is the served file.
func (s *Server) Path() string { return filepath.Join(s.dir, s.name) }

// UsesIOURing says whether requests come over io_uring queues.
func (s *Server) UsesIOURing() bool { return s.rings != nil }

// Close unmounts the file and waits for the server's goroutines; requests
// in flight end with an error for their callers.
func (s *Server) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	s.closeMu.Unlock()
	err := syscall.Unmount(s.dir, syscall.MNT_DETACH)
	if errors.Is(err, syscall.EINVAL) {
		err = nil // not mounted any more
	}
	s.abortConnection() // wakes readers and ring queues still waiting
	s.readers.Wait()
	for _, r := range []*rings{s.rings, s.failed} {
		if r != nil {
			r.close()
		}
	}
	syscall.Close(s.fd)
	if err != nil {
		return fmt.Errorf("fusefile: unmounting %s: %w", s.dir, err)
	}
	return nil
}

// abortConnection ends the connection through the fusectl file system: a
// file still open (a loop device on it) keeps a detached mount and its
// connection alive, and readers waiting on it. Where fusectl is not
// mounted, a private mount of it serves for the write and goes after, so
// the host is left as it was.
func (s *Server) abortConnection() {
	if !s.connKnown {
		return // never initialised: the unmount ended it
	}
	conn := strconv.FormatUint(s.conn, 10)
	ctl := "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(ctl, conn)); err != nil {
		tmp, err := os.MkdirTemp("", "strata-fusectl-")
		if err != nil {
			s.log.WithError(err).Warn("FUSE: cannot abort the connection; waiting for its users")
			return
		}
		defer os.Remove(tmp)
		if err := syscall.Mount("fusectl", tmp, "fusectl", 0, ""); err != nil {
			s.log.WithError(err).Warn("FUSE: cannot mount fusectl to abort the connection; waiting for its users")
			return
		}
		defer func() { _ = syscall.Unmount(tmp, 0) }()
		ctl = tmp
	}
	// Not there: the connection is already gone.
	if err := os.WriteFile(filepath.Join(ctl, conn, "abort"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.WithError(err).Warn("FUSE: aborting the connection failed; waiting for its users")
	}
}

// CleanStale unmounts what is mounted on dir, for a caller that knows no
// live server of its own is there: a FUSE server that died (kill -9) left
// its mount, whose file answers ENOTCONN and whose directory cannot be
// mounted again. mount-utils tells a mount point by its device (the
// directory's stat may still succeed from cached attributes) or by a
// corrupted mount's stat error. The unmount is lazy: a loop device may
// still hold the dead file.
func CleanStale(dir string) error {
	notMount, err := mount.New("").IsLikelyNotMountPoint(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil && !mount.IsCorruptedMnt(err):
		return fmt.Errorf("fusefile: %s: %w", dir, err)
	case err == nil && notMount:
		return nil
	}
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("fusefile: unmounting the stale mount %s: %w", dir, err)
	}
	return nil
}
