package fsfreeze

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/fusefile"
	"github.com/strata-storage/strata/test/need"
)

// gatedDevice is an in-memory device whose writes and flushes wait while
// its gate is shut: the storage under a filesystem stops answering, as
// an unreachable replica would.
type gatedDevice struct {
	*blockdev.Mem
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
}

func (d *gatedDevice) wait() {
	d.mu.Lock()
	ch := d.open
	d.mu.Unlock()
	<-ch
}

func (d *gatedDevice) shut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.open = make(chan struct{})
}

func (d *gatedDevice) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.open:
	default:
		close(d.open)
	}
}

func (d *gatedDevice) WriteAt(p []byte, off int64) (int, error) {
	d.wait()
	return d.Mem.WriteAt(p, off)
}
func (d *gatedDevice) Flush() error { d.wait(); return d.Mem.Flush() }

// A real filesystem whose FIFREEZE never returns: ext4 on a loop device
// on a FUSE file (as the node plugin's path is) whose storage stopped
// answering with dirty data in the page cache. The freeze fails at its
// bound with the reason; once the storage answers again, the freeze that
// finished late is thawed at once and the filesystem takes writes.
func TestHungFreezeOfARealFilesystem(t *testing.T) {
	needRoot(t)
	need.File(t, "/dev/fuse")
	dev := &gatedDevice{Mem: blockdev.NewMem(64 << 20), open: make(chan struct{})}
	dev.release()
	srv, err := fusefile.Mount(t.TempDir(), dev, fusefile.Options{Log: logrus.StandardLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	run(t, "mkfs.ext4", "-q", "-F", srv.Path())
	device := strings.TrimSpace(run(t, "losetup", "-f", "--show", srv.Path()))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", device).Run() })
	mnt := filepath.Join(t.TempDir(), "mnt")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	run(t, "mount", device, mnt)
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	t.Cleanup(dev.release) // first of the cleanups: nothing may stay hung

	f := New(t.TempDir(), func(string) (Target, error) { return Target{Device: device, MountPoint: mnt}, nil },
		SystemOps, logrus.StandardLogger())
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "dirty"), make([]byte, 1<<20), 0o644))
	dev.shut()
	start := time.Now()
	_, err = f.Freeze(context.Background(), "v", "cut", time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the freeze gives up at its bound")
	assert.Less(t, time.Since(start), 5*time.Second)
	t.Logf("hung freeze failed after %v: %v", time.Since(start).Round(time.Millisecond), err)

	dev.release()
	// The late freeze is thawed by itself; then the volume can be cut again.
	require.Eventually(t, func() bool {
		c, err := f.Freeze(context.Background(), "v", "cut-2", 10*time.Second)
		if err != nil {
			return false
		}
		assert.Equal(t, Filesystem, c)
		return assert.NoError(t, f.Thaw("v", "cut-2"))
	}, time.Minute, 50*time.Millisecond, "the late freeze thawed, the volume free again")
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "after"), []byte("x"), 0o644))
	run(t, "sync", "-f", filepath.Join(mnt, "after"))
}
