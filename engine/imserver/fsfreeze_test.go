package imserver

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/internal/fsfreeze"
)

// freezeLog is a node plugin's freezer whose system calls are recorded:
// the protocol and the freezer are the real ones, the filesystem is not
// (this package's tests have no mounted volume).
type freezeLog struct {
	mu     sync.Mutex
	events []string
	fail   error
	// during is called at FIFREEZE and FITHAW, to look at the engine then.
	during func(event string)
}

func (l *freezeLog) record(event string) error {
	l.mu.Lock()
	l.events = append(l.events, event)
	during, fail := l.during, l.fail
	l.mu.Unlock()
	if during != nil {
		during(event)
	}
	if event == "freeze" {
		return fail
	}
	return nil
}

func (l *freezeLog) seen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// servePlugin serves a freezer for the volume "vol" on a socket and
// returns the socket's path.
func servePlugin(t *testing.T, log *freezeLog) string {
	t.Helper()
	ops := fsfreeze.Ops{
		Freeze: func(string) error { return log.record("freeze") },
		Thaw:   func(string) error { return log.record("thaw") },
		Flush:  func(string) error { return log.record("flush") },
	}
	f := fsfreeze.New(t.TempDir(), func(v string) (fsfreeze.Target, error) {
		if v != "vol" {
			return fsfreeze.Target{}, nil
		}
		return fsfreeze.Target{Device: "/dev/loop9", MountPoint: "/mnt/vol"}, nil
	}, ops, logrus.StandardLogger())
	socket := filepath.Join(t.TempDir(), "fsfreeze", "plugin.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Serve(ctx, socket) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool {
		_, err := fsfreeze.NewClient(socket).Freeze(ctx, "other", "probe", time.Second)
		return err == nil
	}, time.Minute, 10*time.Millisecond, "the freezer answers")
	return socket
}

// A snapshot asked with a freeze bound is cut between the filesystem's
// freeze and its thaw, and says so in its label; without one it is cut
// as a power cut would, and says that.
func TestSnapshotInsideAFilesystemFreeze(t *testing.T) {
	log := &freezeLog{}
	im := newTestIM(t, Options{FSFreezeSocket: servePlugin(t, log)})
	ctx := context.Background()
	startEngine(t, im)
	hasSnapshot := func(name string) bool {
		snaps, err := im.c.SnapshotList(ctx, "e")
		require.NoError(t, err)
		_, ok := snaps[name]
		return ok
	}
	var atFreeze, atThaw bool
	log.during = func(event string) {
		switch event {
		case "freeze":
			atFreeze = hasSnapshot("frozen")
		case "thaw":
			atThaw = hasSnapshot("frozen")
		}
	}
	_, err := im.c.SnapshotCreate(ctx, "e", "frozen", true, map[string]string{"app": "db"}, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{"freeze", "thaw"}, log.seen())
	assert.False(t, atFreeze, "not cut yet when the filesystem froze")
	assert.True(t, atThaw, "cut before the thaw")
	log.during = nil

	_, err = im.c.SnapshotCreate(ctx, "e", "plain", true, nil, 0)
	require.NoError(t, err)
	assert.Len(t, log.seen(), 2, "no freeze asked, none made")

	log.fail = errors.New("device hung")
	_, err = im.c.SnapshotCreate(ctx, "e", "failed", true, nil, 10*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "freezing the filesystem of volume vol for snapshot failed (the snapshot is not taken")
	assert.Contains(t, err.Error(), "device hung")
	assert.False(t, hasSnapshot("failed"))
	log.fail = nil

	snaps, err := im.c.SnapshotList(ctx, "e")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"app": "db", fsfreeze.ConsistencyLabel: "filesystem"}, snaps["frozen"].Labels)
	assert.Equal(t, "crash", snaps["plain"].Labels[fsfreeze.ConsistencyLabel])
}

// A group cut freezes the filesystem before the engine and thaws it after.
func TestGroupCutFreezesTheFilesystemFirst(t *testing.T) {
	log := &freezeLog{}
	im := newTestIM(t, Options{FSFreezeSocket: servePlugin(t, log)})
	ctx := context.Background()
	startEngine(t, im)
	eng := im.engine(t, "e")
	var frozenAtFS bool
	log.during = func(event string) {
		if event == "freeze" {
			frozenAtFS = eng.FrozenFor() != ""
		}
	}
	require.NoError(t, im.c.EngineFreeze(ctx, "e", "g1", time.Minute, 10*time.Second))
	assert.False(t, frozenAtFS, "the filesystem froze while the engine still took its writeback")
	assert.Equal(t, "g1", eng.FrozenFor())
	require.NoError(t, im.c.SnapshotCreateInCut(ctx, "e", "g1", "member", true, nil))
	require.NoError(t, im.c.EngineThaw(ctx, "e", "g1"))
	assert.Equal(t, []string{"freeze", "thaw"}, log.seen())
	snaps, err := im.c.SnapshotList(ctx, "e")
	require.NoError(t, err)
	assert.Equal(t, "filesystem", snaps["member"].Labels[fsfreeze.ConsistencyLabel])
}

// No plugin on the node (no socket): snapshots are cut, crash-consistent.
func TestNoPluginMeansCrashConsistent(t *testing.T) {
	im := newTestIM(t, Options{FSFreezeSocket: filepath.Join(t.TempDir(), "none.sock")})
	ctx := context.Background()
	startEngine(t, im)
	_, err := im.c.SnapshotCreate(ctx, "e", "s", true, nil, 10*time.Second)
	require.NoError(t, err)
	snaps, err := im.c.SnapshotList(ctx, "e")
	require.NoError(t, err)
	assert.Equal(t, "crash", snaps["s"].Labels[fsfreeze.ConsistencyLabel])
}

// startEngine starts the engine "e" of volume "vol" on one 4 MiB replica.
func startEngine(t *testing.T, im *testIM) {
	t.Helper()
	rep := im.createReplica(t, "r", 4*mib)
	_, err := im.c.InstanceCreate(context.Background(), engineReq("e", 4*mib, map[string]string{"r": rep.Address}))
	require.NoError(t, err)
}
