package backup

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Pure decisions of the recurring-job controller: when a tick is due, what
// a run's objects are called, and which of a job's objects retention drops.
// Table-tested in recurring_job_controller_test.go.

// missedTickWindow bounds the walk over missed ticks: when some tick fell
// within it, the walk to the latest starts there, so a job whose managers
// were down for a month does not step through 40,000 minutely ticks.
const missedTickWindow = 48 * time.Hour

// dueTick says whether a tick after base is due at now. When one is, it
// returns the latest tick at or before now — a run missed while every
// manager was down runs once, for the latest tick, not once per tick
// missed. When none is, it returns the next tick (zero if the schedule has
// none within the five years robfig/cron looks ahead).
func dueTick(s cron.Schedule, base, now time.Time) (time.Time, bool) {
	next := s.Next(base)
	if next.IsZero() || next.After(now) {
		return next, false
	}
	tick := next
	if recent := s.Next(now.Add(-missedTickWindow)); !recent.IsZero() && recent.After(tick) && !recent.After(now) {
		tick = recent
	}
	for {
		n := s.Next(tick)
		if n.IsZero() || n.After(now) {
			return tick, true
		}
		tick = n
	}
}

// maxObjectNameLen is the longest snapshot name the data plane takes
// (types.ValidateSnapshotName); Backups use the same name.
const maxObjectNameLen = 63

// recurringObjectName names the snapshot (and backup) job makes of volume
// for tick: <job>-<volume>-<yyyymmdd-hhmmss>-<hash>. The same inputs give
// the same name, so a retried run finds what it made instead of making a
// second one. The hash of job and volume keeps two pairs apart whose
// concatenations match ("a-b"+"c" and "a"+"b-c") and names stay unique
// when a long job or volume name is cut to fit 63 characters.
func recurringObjectName(job, volume string, tick time.Time) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(job))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(volume))
	suffix := fmt.Sprintf("-%s-%06x", tick.UTC().Format("20060102-150405"), h.Sum32()&0xffffff)
	prefix := job + "-" + volume
	if len(prefix)+len(suffix) > maxObjectNameLen {
		prefix = strings.TrimRight(prefix[:maxObjectNameLen-len(suffix)], "-.")
	}
	return prefix + suffix
}

// retainState is where one of a job's snapshots or backups stands for
// retention.
type retainState int

const (
	// retainPending: still being taken; never deleted, not counted.
	retainPending retainState = iota
	// retainGood: taken; counted against retain.
	retainGood
	// retainFailed: failed; dropped once a newer good one exists, so the
	// latest failure stays to be read while nothing has replaced it.
	retainFailed
)

// retainItem is one snapshot or backup as retention sees it.
type retainItem struct {
	name  string
	at    time.Time
	state retainState
}

// retentionVictims lists what to delete so that the newest retain good
// items stay: good ones beyond retain, failed ones older than a good one.
// Pending ones are never deleted.
func retentionVictims(items []retainItem, retain int) []string {
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b retainItem) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return strings.Compare(b.name, a.name)
	})
	var victims []string
	good := 0
	for _, it := range sorted {
		switch it.state {
		case retainGood:
			good++
			if good > retain {
				victims = append(victims, it.name)
			}
		case retainFailed:
			if good > 0 {
				victims = append(victims, it.name)
			}
		}
	}
	return victims
}
