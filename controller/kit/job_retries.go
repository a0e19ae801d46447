package kit

import (
	"sync"
	"time"

	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/engineapi"
)

// jobRetry is what a manager remembers of an object's failed instance
// manager jobs (a backup's or a restore's).
type jobRetry struct {
	attempts int
	// revision is the instance's revision when the job was last started: an
	// error status at or below it is the previous attempt's.
	revision uint64
	// counted: the last failure is counted and no attempt started since. The
	// instance's revision also moves for changes that are not the job's (a
	// purge's progress, a snapshot), and the same error seen at a later
	// revision is not a new failure.
	counted bool
	// notBefore is when the next attempt may start.
	notBefore time.Time
}

// JobRetries keeps the failed jobs of the objects a controller runs, by
// UID, in memory: a restarted manager starts counting again, which is
// fine since the job it finds (or starts) is the one that counts.
type JobRetries struct {
	mu sync.Mutex
	m  map[k8stypes.UID]*jobRetry
}

func NewJobRetries() *JobRetries { return &JobRetries{m: map[k8stypes.UID]*jobRetry{}} }

// get is a copy of uid's record, nil when its jobs have not failed.
func (r *JobRetries) get(uid k8stypes.UID) *jobRetry {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j := r.m[uid]; j != nil {
		cp := *j
		return &cp
	}
	return nil
}

// Started notes the instance revision a retried job was started at.
func (r *JobRetries) Started(uid k8stypes.UID, revision uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j := r.m[uid]; j != nil {
		j.revision, j.counted = revision, false
	}
}

// Failed counts a failure seen at revision and returns the attempts so far
// and how long to wait before the next: base, doubled at each further one.
func (r *JobRetries) Failed(uid k8stypes.UID, revision uint64, now time.Time, base time.Duration) (int, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.m[uid]
	if j == nil {
		j = &jobRetry{}
		r.m[uid] = j
	}
	j.attempts++
	j.revision, j.counted = revision, true
	wait := base << (j.attempts - 1)
	j.notBefore = now.Add(wait)
	return j.attempts, wait
}

// PreviousError tells an error status (state) at revision that is the
// previous attempt's: the job started again since has not shown yet.
func (r *JobRetries) PreviousError(uid k8stypes.UID, state string, revision uint64) bool {
	j := r.get(uid)
	return state == engineapi.JobStateError && j != nil && (j.counted || revision <= j.revision)
}

// BackoffLeft is how long the next attempt of uid's job must still wait.
func (r *JobRetries) BackoffLeft(uid k8stypes.UID, now time.Time) time.Duration {
	if j := r.get(uid); j != nil && now.Before(j.notBefore) {
		return j.notBefore.Sub(now)
	}
	return 0
}

// EndBackoff lets the job's next attempt run now: tests pass the backoff
// this way, as moving the clock would also expire the node leases.
func (r *JobRetries) EndBackoff(uid k8stypes.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j := r.m[uid]; j != nil {
		j.notBefore = time.Time{}
	}
}

func (r *JobRetries) Forget(uid k8stypes.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, uid)
}
