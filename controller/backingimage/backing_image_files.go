package backingimage

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/internal/atomicfile"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/types"
)

// A copy's file is kit.BackingImageFile. The work files of a transfer sit
// beside it and never carry the final name, so the final name always means
// a complete, checked copy; transfers are bounded per manager and retried
// with back-off.
const (
	backingSourcePart  = "source.part" // a download or upload as it arrives
	maxFileTransfers   = 2             // per manager: each reads or writes a whole image
	fileRetryBaseDelay = 5 * time.Second
	fileRetryMaxDelay  = 5 * time.Minute
)

// fileJobKey names one transfer: an image (by UID, so a re-created image of
// the same name starts afresh) onto one disk.
type fileJobKey struct {
	image k8stypes.UID
	disk  string
}

// fileJob is a transfer (fetch, upload, copy or verification) running in
// the background. Its fields change under fileJobs.mu.
type fileJob struct {
	startedAt time.Time // monotonic: compared with limit setting changes
	kind      string    // for messages: "downloading", "copying from disk X", …
	cancel    context.CancelFunc
	done      bool
	progress  int32
	result    imagefile.Result
	err       error
	// generation is the image's metadata.generation when the job started:
	// a failure for good holds the copy until the spec moves past it.
	generation int64
}

// fileJobs are this manager's transfers: at most maxFileTransfers move data
// at a time, the rest wait for a slot. A finished job's outcome stays until
// the sync that records it takes it (take).
type fileJobs struct {
	mu    sync.Mutex
	jobs  map[fileJobKey]*fileJob
	slots chan struct{}
	// verified are the copies whose checksum this process has checked:
	// a file found at start-up is read once more before it is trusted.
	verified map[fileJobKey]bool
	// failedForGood are the copies whose last transfer failed for good
	// (permanentCopyError), with the image generation it ran at. Only in
	// memory: a restarted manager tries such a copy once more, after the
	// back-off, and then knows again.
	failedForGood map[fileJobKey]int64
	// limitChangedAt is when each backing image limit setting last changed
	// in this process (monotonic clock; backing_image_limits.go).
	limitChangedAt map[types.SettingName]time.Time
	runCtx         context.Context
	// uploads are the images an upload is arriving for at this manager,
	// from the request's start (before its disk is chosen) to its end.
	uploads map[k8stypes.UID]bool
	// changed is told the image whose job moved (progress or end).
	changed func(image k8stypes.UID)
}

func newFileJobs(changed func(k8stypes.UID)) *fileJobs {
	return &fileJobs{jobs: map[fileJobKey]*fileJob{}, slots: make(chan struct{}, maxFileTransfers),
		verified: map[fileJobKey]bool{}, failedForGood: map[fileJobKey]int64{}, runCtx: context.Background(),
		limitChangedAt: map[types.SettingName]time.Time{},
		uploads:        map[k8stypes.UID]bool{}, changed: changed}
}

// jobReport is what a running transfer tells its job: percent done.
type jobReport func(percent int32)

// start runs work in the background as the job for k, unless one exists;
// generation is the image's when it starts.
func (j *fileJobs) start(k fileJobKey, kind string, generation int64,
	work func(ctx context.Context, report jobReport) (imagefile.Result, error)) {
	j.startFrom(context.Background(), k, kind, generation, work)
}

// startFrom is start for a job that also ends with parent (an upload ends
// with its request). ended is closed once the job is over (its outcome
// recorded for take); nil when a job for k existed and nothing started.
func (j *fileJobs) startFrom(parent context.Context, k fileJobKey, kind string, generation int64,
	work func(ctx context.Context, report jobReport) (imagefile.Result, error)) (ended <-chan struct{}) {
	j.mu.Lock()
	if _, ok := j.jobs[k]; ok {
		j.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(j.runCtx)
	stopParent := context.AfterFunc(parent, cancel)
	job := &fileJob{kind: kind, generation: generation, cancel: cancel, startedAt: time.Now()}
	j.jobs[k] = job
	j.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer stopParent()
		defer cancel()
		res, err := j.run(ctx, k, job, work)
		j.mu.Lock()
		job.done, job.result, job.err = true, res, err
		if err == nil {
			job.progress = 100
			j.verified[k] = true
		}
		j.mu.Unlock()
		j.changed(k.image)
	}()
	return done
}

// beginUpload marks an upload of image as arriving here; false if one
// already is (the caller refuses the second at once).
func (j *fileJobs) beginUpload(image k8stypes.UID) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.uploads[image] {
		return false
	}
	j.uploads[image] = true
	return true
}

func (j *fileJobs) endUpload(image k8stypes.UID) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.uploads, image)
}

// uploading tells whether an upload of image is arriving here.
func (j *fileJobs) uploading(image k8stypes.UID) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.uploads[image]
}

// run waits for a transfer slot, then does the work, reporting each whole
// percent (at most one report per second, so a fast copy costs few writes).
func (j *fileJobs) run(ctx context.Context, k fileJobKey, job *fileJob,
	work func(ctx context.Context, report jobReport) (imagefile.Result, error)) (imagefile.Result, error) {
	select {
	case j.slots <- struct{}{}:
		defer func() { <-j.slots }()
	case <-ctx.Done():
		return imagefile.Result{}, ctx.Err()
	}
	var last time.Time
	report := func(p int32) {
		j.mu.Lock()
		moved := p > job.progress
		if moved {
			job.progress = p
		}
		j.mu.Unlock()
		if moved && time.Since(last) >= time.Second {
			last = time.Now()
			j.changed(k.image)
		}
	}
	return work(ctx, report)
}

// get returns a copy of k's job, if any.
func (j *fileJobs) get(k fileJobKey) (fileJob, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	job, ok := j.jobs[k]
	if !ok {
		return fileJob{}, false
	}
	return *job, true
}

// take removes k's finished job once the status recording its outcome is
// written.
func (j *fileJobs) take(k fileJobKey) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if job, ok := j.jobs[k]; ok && job.done {
		delete(j.jobs, k)
	}
}

// stop cancels k's job and forgets it and its verification.
func (j *fileJobs) stop(k fileJobKey) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if job, ok := j.jobs[k]; ok {
		job.cancel()
		delete(j.jobs, k)
	}
	delete(j.verified, k)
	delete(j.failedForGood, k)
}

func (j *fileJobs) isVerified(k fileJobKey) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.verified[k]
}

// markFailedForGood records that k's transfer at generation failed for good.
func (j *fileJobs) markFailedForGood(k fileJobKey, generation int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.failedForGood[k] = generation
}

// failedForGoodAt is the generation k last failed for good at, if it did.
func (j *fileJobs) failedForGoodAt(k fileJobKey) (int64, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	gen, ok := j.failedForGood[k]
	return gen, ok
}

func (j *fileJobs) forgetFailure(k fileJobKey) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.failedForGood, k)
}

func (j *fileJobs) forgetVerified(k fileJobKey) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.verified, k)
}

// createSourcePart makes the image's directory on a disk and an empty
// source.part in it, where a fetched, uploaded or exported source lands
// before it is prepared; the caller removes it.
func createSourcePart(dir string) (*os.File, string, error) {
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	part := filepath.Join(dir, backingSourcePart)
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	return f, part, err
}

// percent turns done/total into a whole percent below 100 (100 means done).
func percent(done, total int64) int32 {
	if total <= 0 {
		return 0
	}
	return int32(min(99, done*100/total))
}

// retryDelay is how long a copy that failed attempts times waits before the
// next try: 5 s doubling up to 5 min, so an unreachable URL is not hammered.
func retryDelay(attempts int32) time.Duration {
	d := fileRetryBaseDelay
	for i := int32(1); i < attempts && d < fileRetryMaxDelay; i++ {
		d *= 2
	}
	return min(d, fileRetryMaxDelay)
}

// strayImageDirs lists the image directories on a disk that no image in keep
// (directory names "<name>-<uuid>") accounts for: left by an image deleted
// while this node was down, or by a crash between a removal's steps.
func strayImageDirs(diskPath string, keep map[string]bool) []string {
	entries, err := os.ReadDir(filepath.Join(diskPath, kit.BackingImagesDir))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && !keep[e.Name()] && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, filepath.Join(diskPath, kit.BackingImagesDir, e.Name()))
		}
	}
	return out
}
