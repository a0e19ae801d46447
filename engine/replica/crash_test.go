package replica

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The crash test re-executes the test binary running TestCrashChild, which
// works on a replica and reports on stdout, one write(2) per line, what it
// started ("B", "Bz" for write-zeroes, "s") and what was acknowledged
// ("A", "S", "P", "D"). The
// parent kills it with SIGKILL at a chosen moment, then opens the replica and
// checks that every acknowledged write and snapshot is there.
const (
	envCrashMode  = "STRATA_REPLICA_CRASH_MODE"
	envCrashDir   = "STRATA_REPLICA_CRASH_DIR"
	envCrashSeed  = "STRATA_REPLICA_CRASH_SEED"
	envCrashPoint = "STRATA_REPLICA_CRASH_POINT"
)

// discardZeroes is how much of the volume the discard mode zeroes.
const discardZeroes = 8 << 20

// fillRandom fills p from seed; the parent regenerates acknowledged writes.
func fillRandom(p []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i < len(p); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < len(p); j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
}

// crashWrite is the child's next write: 1 B..64 KiB, half of them unaligned.
func crashWrite(rng *rand.Rand, size int64) (off, length int64) {
	length = 1 + rng.Int64N(64<<10)
	if rng.IntN(2) == 0 {
		length = (length + bs - 1) / bs * bs
	}
	off = rng.Int64N(size - length)
	if rng.IntN(2) == 0 {
		off = off / bs * bs
	}
	return off, length
}

func TestCrashChild(t *testing.T) {
	mode := os.Getenv(envCrashMode)
	if mode == "" {
		t.Skip("helper process for TestCrash")
	}
	seed, _ := strconv.ParseUint(os.Getenv(envCrashSeed), 10, 64)
	say := func(format string, args ...any) {
		// One write(2) per line: once it returns, the parent will read it
		// even if this process is killed right after.
		if _, err := os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n"); err != nil {
			os.Exit(3)
		}
	}
	if point := os.Getenv(envCrashPoint); point != "" {
		crashHook = func(p string) {
			if p == point {
				say("K %s", p)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}
	r, err := Open(os.Getenv(envCrashDir))
	if err != nil {
		say("E open: %v", err)
		os.Exit(2)
	}
	if mode == "revert" {
		say("r kid")
		if err := r.Revert("kid"); err != nil {
			say("E revert: %v", err)
			os.Exit(2)
		}
		say("R kid")
		return
	}
	if mode == "discard" {
		// The whole volume goes: zeroes at the start, a trim of the rest.
		// The purge then frees every block of the removed snapshot.
		size := r.Size()
		say("U %d %d", discardZeroes, size-discardZeroes)
		if err := r.Unmap(discardZeroes, size-discardZeroes); err != nil {
			say("E unmap: %v", err)
			os.Exit(2)
		}
		if err := r.WriteZeroes(0, discardZeroes); err != nil {
			say("E write-zeroes: %v", err)
			os.Exit(2)
		}
		say("Z 0 %d", discardZeroes)
		crashPoint("discard:marked") // a restart before the purge
		mode = "purge"
	}
	if mode == "purge" {
		go func() {
			err := r.Purge(context.Background(), func(pct int) { say("P %d", pct) })
			if err != nil {
				say("E purge: %v", err)
				os.Exit(2)
			}
			say("D")
		}()
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	buf := make([]byte, 64<<10)
	for i := range 200000 {
		if (mode == "write" || mode == "zeroes") && i%50 == 49 {
			name := fmt.Sprintf("c%d", i)
			say("s %s", name)
			if err := r.Snapshot(name, SnapshotOptions{UserCreated: i%100 == 49}); err != nil {
				say("E snapshot: %v", err)
				os.Exit(2)
			}
			say("S %s", name)
		}
		off, length := crashWrite(rng, r.Size())
		if mode == "zeroes" && i%3 == 0 {
			// Zeroes over what the snapshots hold, up to 1 MiB: the head
			// marks them (zeromarks.go) and drops its own data there.
			if i%2 == 0 {
				length = min(length*16, r.Size()-off)
			}
			say("Bz %d %d", off, length)
			if err := r.WriteZeroes(off, length); err != nil {
				say("E write-zeroes: %v", err)
				os.Exit(2)
			}
			say("A")
			continue
		}
		ws := rng.Uint64()
		p := buf[:length]
		fillRandom(p, ws)
		say("B %d %d %d", off, length, ws)
		if _, err := r.WriteAt(p, off); err != nil {
			say("E write: %v", err)
			os.Exit(2)
		}
		say("A")
	}
}

type inflightWrite struct {
	off, length int64
	seed        uint64
	zero        bool // write-zeroes
}

// crashModel is what the parent knows must be on disk.
type crashModel struct {
	data     []byte
	snaps    map[string][]byte
	acked    []string       // snapshots acknowledged
	inflight *inflightWrite // a write started but not acknowledged
	started  string         // snapshot started but not acknowledged
	pct      int
	done     bool
	reverted bool
	point    string // crash point the child killed itself at
	lines    int
	// loose: blocks trimmed and not rewritten whole since; each byte may
	// read as it was or as zero.
	loose map[int64]bool
	// discarded: the discard mode's trim and zeroes were acknowledged.
	discarded bool
}

func (m *crashModel) apply(t *testing.T, line string) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	num := func(i int) int64 {
		n, err := strconv.ParseInt(f[i], 10, 64)
		require.NoError(t, err, "child line %q", line)
		return n
	}
	switch f[0] {
	case "B":
		seed, err := strconv.ParseUint(f[3], 10, 64)
		require.NoError(t, err, "child line %q", line)
		m.inflight = &inflightWrite{off: num(1), length: num(2), seed: seed}
	case "Bz":
		m.inflight = &inflightWrite{off: num(1), length: num(2), zero: true}
	case "A":
		w := m.inflight
		if w.zero {
			clear(m.data[w.off : w.off+w.length])
		} else {
			fillRandom(m.data[w.off:w.off+w.length], w.seed)
		}
		for b := (w.off + bs - 1) / bs; b < (w.off+w.length)/bs; b++ {
			delete(m.loose, b)
		}
		m.inflight = nil
	case "U":
		if m.loose == nil {
			m.loose = map[int64]bool{}
		}
		for b := (num(1) + bs - 1) / bs; b < (num(1)+num(2))/bs; b++ {
			m.loose[b] = true
		}
	case "Z":
		m.discarded = true
		clear(m.data[num(1) : num(1)+num(2)])
		for b := num(1) / bs; b < (num(1)+num(2))/bs; b++ {
			delete(m.loose, b)
		}
	case "s":
		m.started = f[1]
	case "S":
		m.snaps[f[1]] = slices.Clone(m.data)
		m.acked = append(m.acked, f[1])
		m.started = ""
	case "P":
		m.pct = int(num(1))
	case "D":
		m.done = true
	case "R":
		m.reverted = true
	case "K":
		m.point = f[1]
	case "r":
	case "E":
		t.Fatalf("child failed: %s", line)
	default:
		return // test framework output
	}
	m.lines++
}

// checkData compares the replica with the model, skipping the range of a
// write that may have been in flight.
func (m *crashModel) checkData(t *testing.T, r *Replica, what string) {
	t.Helper()
	got := make([]byte, len(m.data))
	_, err := r.ReadAt(got, 0)
	require.NoError(t, err)
	want := m.data
	if m.inflight != nil || len(m.loose) > 0 {
		want = slices.Clone(want)
	}
	if w := m.inflight; w != nil && w.zero {
		// Zeroes in flight: each byte as it was or zero, never older data.
		for i := w.off; i < w.off+w.length; i++ {
			if got[i] == 0 {
				want[i] = 0
			}
		}
	} else if w != nil {
		copy(want[w.off:w.off+w.length], got[w.off:w.off+w.length])
	}
	for b := range m.loose {
		for i := b * bs; i < (b+1)*bs; i++ {
			if got[i] == 0 {
				want[i] = 0
			}
		}
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("%s: byte %d differs: got %#x, want %#x (in-flight write %v)", what, i, got[i], want[i], m.inflight)
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// runChild runs the helper and kills it once stop says so (after its own
// delay); it returns the model built from what the child acknowledged.
func runChild(t *testing.T, mode, dir string, seed uint64, m *crashModel, stop func(*crashModel) bool, delay time.Duration) (killed bool) {
	return runChildAt(t, mode, dir, seed, "", m, stop, delay)
}

// runChildAt is runChild where the child may also kill itself at a crash
// point.
func runChildAt(t *testing.T, mode, dir string, seed uint64, point string, m *crashModel,
	stop func(*crashModel) bool, delay time.Duration) (killed bool) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envCrashMode+"="+mode, envCrashDir+"="+dir,
		envCrashSeed+"="+strconv.FormatUint(seed, 10), envCrashPoint+"="+point)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	watchdog := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
	defer watchdog.Stop()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		m.apply(t, sc.Text())
		if !killed && stop(m) {
			killed = true
			go func() {
				time.Sleep(delay)
				cmd.Process.Signal(syscall.SIGKILL)
			}()
		}
	}
	err = cmd.Wait()
	if killed || point != "" {
		require.Error(t, err, "child should have died of SIGKILL")
	}
	return killed
}

// TestCrashWrites kills a writer after a few lines of its log; the long
// mode (make test-long) goes on to later kills.
func TestCrashWrites(t *testing.T) { crashWrites(t, []int{1, 37}) }

func TestLongCrashWrites(t *testing.T) { crashWrites(t, []int{1, 37, 120, 301, 555, 900}) }

// TestCrashZeroes is TestCrashWrites with write-zeroes among the writes:
// zeros acknowledged over a snapshot's data never read as that data after
// a kill (their marks are written before the ack).
func TestCrashZeroes(t *testing.T) { crashWritesMode(t, "zeroes", []int{57, 240, 613}) }

func crashWrites(t *testing.T, kills []int) { crashWritesMode(t, "write", kills) }

func crashWritesMode(t *testing.T, mode string, kills []int) {
	for i, after := range kills {
		t.Run(fmt.Sprintf("after-%d-lines", after), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "r")
			const size = 16 << 20
			r, err := Create(dir, size, CreateOptions{})
			require.NoError(t, err)
			require.NoError(t, r.Close())
			m := &crashModel{data: make([]byte, size), snaps: map[string][]byte{}}
			delay := time.Duration(i*150) * time.Microsecond
			killed := runChild(t, mode, dir, uint64(1000+i), m,
				func(m *crashModel) bool { return m.lines >= after }, delay)
			require.True(t, killed)
			t.Logf("killed after %d lines (+%v): %d snapshots acknowledged, in flight: write %v snapshot %q",
				m.lines, delay, len(m.acked), m.inflight, m.started)

			verifyWrites(t, dir, m)
		})
	}
}

// verifyWrites checks a replica after a kill during the write stream and
// returns the names of its snapshots.
func verifyWrites(t *testing.T, dir string, m *crashModel) map[string]bool {
	r, err := Open(dir)
	require.NoError(t, err, "open after kill")
	defer func() { r.Close() }()
	m.checkData(t, r, "after kill")
	info, err := r.Chain()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, l := range info.Layers {
		names[l.Name] = true
	}
	for _, s := range m.acked {
		require.True(t, names[s], "acknowledged snapshot %s missing", s)
	}
	require.LessOrEqual(t, len(info.Layers), len(m.acked)+2, "only the in-flight snapshot may be extra")
	assertNoLeftovers(t, dir, info)
	// Snapshots hold what they held when acknowledged.
	for _, s := range m.acked[max(0, len(m.acked)-2):] {
		require.NoError(t, r.Revert(s))
		got := make([]byte, len(m.data))
		_, err := r.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, -1, firstDiff(got, m.snaps[s]), "content of snapshot %s", s)
	}
	return names
}

// assertNoLeftovers checks the directory holds exactly the chain's files:
// volume.meta, an image and a .meta per layer, and optional discard and
// zero-marks files of layers that are there.
func assertNoLeftovers(t *testing.T, dir string, info Info) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var files []string
	present := map[string]bool{}
	for _, e := range entries {
		present[e.Name()] = true
	}
	for _, e := range entries {
		n := e.Name()
		switch {
		case strings.HasSuffix(n, discardSuffix):
		case strings.HasSuffix(n, zeroSuffix):
			require.True(t, present[strings.TrimSuffix(n, ".zero")], "zero marks %s of no layer; files: %v", n, entries)
		default:
			files = append(files, n)
		}
	}
	require.Len(t, files, 1+2*len(info.Layers), "files: %v", files)
}

// purgeSetup builds a replica where "big" is removed and has one child: the
// snapshot "kid" (coalesce) or the head (prune).
func purgeSetup(t *testing.T, dir, kind string, m *crashModel) {
	const size = 64 << 20
	r, err := Create(dir, size, CreateOptions{})
	require.NoError(t, err)
	defer r.Close()
	m.data = make([]byte, size)
	rng := rand.New(rand.NewPCG(uint64(len(kind)), 7))
	write := func(total, chunk int64) {
		p := make([]byte, chunk)
		for done := int64(0); done < total; done += chunk {
			off := rng.Int64N(size/chunk) * chunk
			fillRandom(p, rng.Uint64())
			_, err := r.WriteAt(p, off)
			require.NoError(t, err)
			copy(m.data[off:], p)
		}
	}
	bigData, kidData := int64(24<<20), int64(8<<20)
	if kind == "into-child" {
		bigData, kidData = kidData, bigData
	}
	write(bigData, 256<<10)
	require.NoError(t, r.Snapshot("big", SnapshotOptions{}))
	if kind == "prune" || kind == "discard" {
		write(16<<20, 64<<10)
	} else {
		write(kidData, 64<<10)
		require.NoError(t, r.Snapshot("kid", SnapshotOptions{UserCreated: true}))
		m.snaps["kid"] = slices.Clone(m.data)
		write(1<<20, 4<<10)
	}
	require.NoError(t, r.RemoveSnapshot("big"))
}

// purgeKill is a moment to kill a purge at: once its progress reaches pct
// (101: once Purge returned), and delay after that.
type purgeKill struct {
	pct   int
	delay time.Duration
}

// TestCrashPurge kills each kind of purge near its end; the long mode
// (make test-long) kills at every moment of the list.
func TestCrashPurge(t *testing.T) {
	crashPurge(t, []purgeKill{{99, 0}, {99, 300 * time.Microsecond}})
}

func TestLongCrashPurge(t *testing.T) {
	crashPurge(t, []purgeKill{{0, 0}, {40, 0}, {99, 0}, {99, 300 * time.Microsecond}, {99, 2 * time.Millisecond}, {101, 0}})
}

func crashPurge(t *testing.T, kills []purgeKill) {
	for _, kind := range []string{"into-snapshot", "into-child", "prune", "discard"} {
		for i, k := range kills {
			t.Run(fmt.Sprintf("%s/pct-%d+%v", kind, k.pct, k.delay), func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "r")
				m := &crashModel{snaps: map[string][]byte{}}
				purgeSetup(t, dir, kind, m)
				mode := "purge"
				if kind == "discard" {
					mode = kind // trims first
				}
				killed := runChild(t, mode, dir, uint64(2000+i), m, func(m *crashModel) bool {
					return (m.pct >= k.pct && k.pct <= 100) || m.done
				}, k.delay)
				require.True(t, killed)
				t.Logf("killed at progress %d (+%v), purge done %v", m.pct, k.delay, m.done)

				verifyPurge(t, dir, kind, m)
			})
		}
	}
}

// verifyPurge checks a replica after a kill during a purge, then finishes
// the purge and checks the result.
func verifyPurge(t *testing.T, dir, kind string, m *crashModel) {
	r, err := Open(dir)
	require.NoError(t, err, "open after kill")
	defer func() { r.Close() }()
	m.checkData(t, r, "after kill")
	info, err := r.Chain()
	require.NoError(t, err)
	assertNoLeftovers(t, dir, info)

	require.NoError(t, r.Purge(context.Background(), nil), "purge after restart")
	m.checkData(t, r, "after purge")
	info, err = r.Chain()
	require.NoError(t, err)
	assertNoLeftovers(t, dir, info)
	var names []string
	for _, l := range info.Layers {
		names = append(names, l.Name)
	}
	switch {
	case kind == "prune":
		require.Equal(t, []string{"big", HeadName}, names)
		return
	case kind == "discard" && m.discarded:
		// The trims' marks outlive the kill (the discard file): the purge
		// after the restart frees every block of big and drops it.
		require.Equal(t, []string{HeadName}, names)
		return
	case kind == "discard": // killed before the zeroes: part of big stays
		require.Contains(t, [][]string{{HeadName}, {"big", HeadName}}, names)
		return
	}
	require.Equal(t, []string{"kid", HeadName}, names)
	require.Equal(t, "", info.Layers[0].Parent)
	require.NoError(t, r.Revert("kid"))
	got := make([]byte, len(m.data))
	_, err = r.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, -1, firstDiff(got, m.snaps["kid"]), "content of kid")
}

// TestCrashPoints kills the child exactly at each step of a structural
// change where the disk holds a distinct state.
func TestCrashPoints(t *testing.T) {
	cases := []struct {
		mode, setup, point string
	}{
		{"write", "", "snapshot:prepared"},
		{"write", "", "snapshot:linked"},
		{"write", "", "snapshot:committed"},
		{"zeroes", "", "zeroes:punched"},
		{"zeroes", "", "snapshot:linked"},
		{"zeroes", "", "snapshot:committed"},
		{"revert", "into-child", "revert:prepared"},
		{"revert", "into-child", "revert:committed"},
		{"purge", "prune", "prune:synced"},
		{"purge", "prune", "prune:half"},
		{"discard", "discard", "discard:marked"},
		{"discard", "discard", "prune:half"},
		{"discard", "discard", "prune:punched"},
		{"discard", "discard", "prune:reparented"},
	}
	for _, p := range []string{"coalesce:copied", "coalesce:meta", "coalesce:swapped", "drop:committed"} {
		cases = append(cases, struct{ mode, setup, point string }{"purge", "into-child", p})
	}
	for _, p := range []string{"coalesce:copied", "coalesce:linked", "coalesce:renamed", "coalesce:meta",
		"coalesce:swapped", "drop:committed"} {
		cases = append(cases, struct{ mode, setup, point string }{"purge", "into-snapshot", p})
	}
	for i, tc := range cases {
		t.Run(tc.mode+"/"+tc.setup+"/"+tc.point, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "r")
			m := &crashModel{snaps: map[string][]byte{}}
			if tc.setup == "" {
				r, err := Create(dir, 16<<20, CreateOptions{})
				require.NoError(t, err)
				require.NoError(t, r.Close())
				m.data = make([]byte, 16<<20)
			} else {
				purgeSetup(t, dir, tc.setup, m)
			}
			pre := slices.Clone(m.data)
			runChildAt(t, tc.mode, dir, uint64(3000+i), tc.point, m, func(*crashModel) bool { return false }, 0)
			require.Equal(t, tc.point, m.point, "the child must have reached the crash point")
			switch tc.mode {
			case "write", "zeroes":
				names := verifyWrites(t, dir, m)
				// Before the commit the snapshot must not exist, after it must.
				require.Equal(t, tc.point == "snapshot:committed", names[m.started],
					"snapshot %s in flight at %s", m.started, tc.point)
			case "purge", "discard":
				verifyPurge(t, dir, tc.setup, m)
			case "revert":
				r, err := Open(dir)
				require.NoError(t, err)
				defer func() { r.Close() }()
				want := pre
				if tc.point == "revert:committed" {
					want = m.snaps["kid"]
				}
				got := make([]byte, len(want))
				_, err = r.ReadAt(got, 0)
				require.NoError(t, err)
				require.Equal(t, -1, firstDiff(got, want), "content after a kill at %s", tc.point)
				info, err := r.Chain()
				require.NoError(t, err)
				assertNoLeftovers(t, dir, info)
			}
		})
	}
}
