package benchscale

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ticketID is the strata-api attachment ticket the bench holds on every
// volume: an attached volume keeps its engine running, so snapshots are
// taken at once, without the snapshot controller's auto-attach.
const ticketID = "bench-scale"

// latencyTimeout is how long one latency sample may wait for ReadyToUse;
// a sample that times out counts with this value (and misses the target).
const latencyTimeout = time.Minute

func volumeName(i int) string { return fmt.Sprintf("bench-%04d", i) }

// nodeFor spreads the attachments, and so the engines, over the nodes.
func nodeFor(i int) string { return fmt.Sprintf("node-%d", i%nodeCount+1) }

func snapshotName(vol, j int) string { return fmt.Sprintf("%s-s%03d", volumeName(vol), j) }

// stepVolumes creates the volumes, waits until all are detached, then
// attaches each through a strata-api ticket and waits until all are attached.
func (b *bench) stepVolumes(ctx context.Context) error {
	n := b.cfg.volumes
	var done atomic.Int64
	start := time.Now()
	stopProgress := b.progress(ctx, "volumes created", n, &done)
	err := parallel(ctx, n, b.cfg.workers, func(ctx context.Context, i int) error {
		v := &v1beta1.Volume{
			ObjectMeta: metav1.ObjectMeta{Name: volumeName(i), Namespace: ns},
			Spec: v1beta1.VolumeSpec{Size: b.cfg.size, NumberOfReplicas: int32(b.cfg.replicas),
				Frontend: v1beta1.VolumeFrontendNBD},
		}
		err := retry(ctx, "create volume "+v.Name, func() error {
			_, err := b.strata.StrataV1beta1().Volumes(ns).Create(ctx, v, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) { // an earlier attempt got through
				return nil
			}
			return err
		})
		done.Add(1)
		return err
	})
	stopProgress()
	if err != nil {
		return err
	}
	created := time.Since(start)
	b.log.WithFields(logrus.Fields{"volumes": n, "took": created.Round(time.Millisecond)}).Info("volumes created")

	detached := func(v *v1beta1.Volume) bool {
		return v.Status.State == v1beta1.VolumeStateDetached && v.Status.CurrentNodeID == ""
	}
	if _, err := b.waitCount(ctx, "volumes detached", n, b.countVolumes(detached), b.describeVolumes(detached)); err != nil {
		return err
	}
	allDetached := time.Since(start)
	b.log.WithField("sinceCreateStart", allDetached.Round(time.Millisecond)).Info("all volumes detached")

	done.Store(0)
	start = time.Now()
	stopProgress = b.progress(ctx, "attachment tickets added", n, &done)
	err = parallel(ctx, n, b.cfg.workers, func(ctx context.Context, i int) error {
		err := b.addTicket(ctx, volumeName(i), nodeFor(i))
		done.Add(1)
		return err
	})
	stopProgress()
	if err != nil {
		return err
	}
	ticketsAdded := time.Since(start)
	attached := func(v *v1beta1.Volume) bool {
		var i int
		_, err := fmt.Sscanf(v.Name, "bench-%d", &i)
		return err == nil && v.Status.State == v1beta1.VolumeStateAttached && v.Status.CurrentNodeID == nodeFor(i)
	}
	if _, err := b.waitCount(ctx, "volumes attached", n, b.countVolumes(attached), b.describeVolumes(attached)); err != nil {
		return err
	}
	allAttached := time.Since(start)
	b.log.WithFields(logrus.Fields{"ticketsAdded": ticketsAdded.Round(time.Millisecond),
		"allAttached": allAttached.Round(time.Millisecond)}).Info("all volumes attached")

	b.info(fmt.Sprintf("create %d volumes", n), fmtDur(created))
	b.info("  … all detached (from first create)", fmtDur(allDetached))
	b.info(fmt.Sprintf("add %d strata-api tickets", n), fmtDur(ticketsAdded))
	b.info("  … all attached (from first ticket)", fmtDur(allAttached))
	return nil
}

// addTicket asks for the volume on node through its VolumeAttachment, which
// the VolumeAttachment controller creates with the same name as the volume.
func (b *bench) addTicket(ctx context.Context, volume, node string) error {
	vas := b.strata.StrataV1beta1().VolumeAttachments(ns)
	return retry(ctx, "ticket on "+volume, func() error {
		va, err := vas.Get(ctx, volume, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if t := va.Spec.AttachmentTickets[ticketID]; t != nil && t.NodeID == node {
			return nil
		}
		if va.Spec.AttachmentTickets == nil {
			va.Spec.AttachmentTickets = map[string]*v1beta1.AttachmentTicket{}
		}
		va.Spec.AttachmentTickets[ticketID] = &v1beta1.AttachmentTicket{ID: ticketID,
			Type: v1beta1.AttacherTypeStrataAPI, NodeID: node, Parameters: map[string]string{}}
		_, err = vas.Update(ctx, va, metav1.UpdateOptions{})
		return err
	})
}

func (b *bench) countVolumes(cond func(*v1beta1.Volume) bool) func() int {
	return func() int {
		vols, _ := b.volumes.List(labels.Everything())
		n := 0
		for _, v := range vols {
			if strings.HasPrefix(v.Name, "bench-") && cond(v) {
				n++
			}
		}
		return n
	}
}

// describeVolumes names a few volumes that do not meet cond, for a stall.
func (b *bench) describeVolumes(cond func(*v1beta1.Volume) bool) func() string {
	return func() string {
		vols, _ := b.volumes.List(labels.Everything())
		var out []string
		for _, v := range vols {
			if strings.HasPrefix(v.Name, "bench-") && !cond(v) {
				out = append(out, fmt.Sprintf("%s: state=%q node=%q owner=%q robustness=%q", v.Name,
					v.Status.State, v.Status.CurrentNodeID, v.Status.OwnerID, v.Status.Robustness))
			}
		}
		slices.Sort(out)
		return fmt.Sprintf("%d volumes are not there, for example: %s", len(out), strings.Join(out[:min(5, len(out))], "; "))
	}
}

// stepSnapshots creates -snapshots Snapshot CRs per volume and waits until
// all are ReadyToUse. The i-th create goes to volume i mod V, so the load
// is spread over every engine rather than piled on one at a time.
func (b *bench) stepSnapshots(ctx context.Context) error {
	v, s := b.cfg.volumes, b.cfg.snapshots
	total := v * s
	if total == 0 {
		b.log.Info("-snapshots 0: no snapshots")
		return nil
	}
	// What the managers write and queue per snapshot, for context: the
	// bench's own creates are the POSTs on snapshots.
	m0, w0, err := b.scrapeBoth(ctx)
	if err != nil {
		return err
	}
	var done atomic.Int64
	start := time.Now()
	stopProgress := b.progress(ctx, "snapshots created", total, &done)
	err = parallel(ctx, total, b.cfg.workers, func(ctx context.Context, k int) error {
		err := b.createSnapshot(ctx, k%v, snapshotName(k%v, k/v))
		done.Add(1)
		return err
	})
	stopProgress()
	if err != nil {
		return err
	}
	created := time.Since(start)
	b.log.WithFields(logrus.Fields{"snapshots": total, "took": created.Round(time.Millisecond)}).Info("snapshots created")
	if _, err := b.waitCount(ctx, "snapshots ReadyToUse", total, b.snaps.readyCount, b.snaps.describe); err != nil {
		return err
	}
	ready := time.Since(start)
	b.log.WithField("sinceCreateStart", ready.Round(time.Millisecond)).Info("all snapshots ReadyToUse")
	b.info(fmt.Sprintf("create %d snapshots", total), fmtDur(created))
	b.info("  … all ReadyToUse (from first create)", fmtDur(ready))

	if _, err := b.waitDrained(ctx, 5*time.Minute); err != nil && !errors.Is(err, errNotDrained) {
		return err
	}
	m1, w1, err := b.scrapeBoth(ctx)
	if err != nil {
		return err
	}
	writes, strataW := w1.minus(w0), 0.0
	strataBy := map[string]float64{}
	for k, v := range writes {
		if strings.HasPrefix(k, "strata.io/") {
			strataW += v
			strataBy[strings.TrimPrefix(k, "strata.io/")] = v
		}
	}
	b.log.WithField("byResource", fmtCounts(writes)).Info("API writes while taking the snapshots")
	b.info("  … strata.io API writes per snapshot (bench's creates included)",
		fmt.Sprintf("%.2f (%s)", strataW/float64(total), fmtCounts(strataBy)))
	perQueue := diffCounts(m1.addsByQueue, m0.addsByQueue)
	for q := range perQueue {
		perQueue[q] = math.Round(perQueue[q]/float64(total)*100) / 100
	}
	b.info("  … workqueue adds per snapshot (3 managers)",
		fmt.Sprintf("%.2f (%s)", (m1.adds-m0.adds)/float64(total), fmtCounts(perQueue)))
	return nil
}

func (b *bench) createSnapshot(ctx context.Context, vol int, name string) error {
	snap := &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1beta1.SnapshotSpec{Volume: volumeName(vol), CreateSnapshot: true},
	}
	return retry(ctx, "create snapshot "+name, func() error {
		_, err := b.strata.StrataV1beta1().Snapshots(ns).Create(ctx, snap, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// stepLatency times snapshots one at a time on random volumes, from the
// moment Create returns to the moment the bench's informer sees the CR
// ReadyToUse: what a user waiting on the object would see.
func (b *bench) stepLatency(ctx context.Context) error {
	n := b.cfg.latencySamples
	if n == 0 {
		b.log.Info("-latency-samples 0: no latency figures")
		return nil
	}
	lat := make([]time.Duration, 0, n)
	timeouts := 0
	for i := range n {
		vol := rand.IntN(b.cfg.volumes)
		name := fmt.Sprintf("%s-lat%03d", volumeName(vol), i)
		ready := b.snaps.await(name)
		if err := b.createSnapshot(ctx, vol, name); err != nil {
			return err
		}
		created := time.Now()
		select {
		case <-ready:
			lat = append(lat, max(0, b.snaps.readyTime(name).Sub(created)))
		case <-time.After(latencyTimeout):
			timeouts++
			lat = append(lat, latencyTimeout)
			b.log.WithField("snapshot", name).Warn("snapshot not ReadyToUse within a minute; counted as a minute")
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := b.checkManagers(); err != nil {
			return err
		}
		if (i+1)%10 == 0 {
			b.log.WithFields(logrus.Fields{"done": i + 1, "of": n}).Info("latency samples")
		}
	}
	slices.Sort(lat)
	p50, p99 := percentile(lat, 0.50), percentile(lat, 0.99)
	b.log.WithFields(logrus.Fields{"samples": n, "p50": fmtDur(p50), "p99": fmtDur(p99), "max": fmtDur(lat[len(lat)-1]),
		"timeouts": timeouts}).Info("snapshot create → ReadyToUse")
	exist := b.snaps.total()
	b.info(fmt.Sprintf("snapshot → ReadyToUse p50 (%d samples, %d snapshots exist)", n, exist), fmtDur(p50))
	b.check("snapshot → ReadyToUse p99", fmtDur(p99), "≤ 1s", p99 <= time.Second)
	b.info("snapshot → ReadyToUse max", fmtDur(lat[len(lat)-1]))
	if timeouts > 0 {
		b.check("latency samples timed out (1 min)", fmt.Sprint(timeouts), "0", false)
	}
	return nil
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// progress logs a counter every 10 s until the returned stop is called.
func (b *bench) progress(ctx context.Context, what string, total int, done *atomic.Int64) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				b.log.WithFields(logrus.Fields{"done": done.Load(), "of": total,
					"elapsed": time.Since(start).Round(time.Second)}).Info(what)
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// retryCreate is retry of a create that an earlier attempt may have done
// already: AlreadyExists is success.
func retryCreate(ctx context.Context, what string, create func() error) error {
	return retry(ctx, what, func() error {
		if err := create(); !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
}

// retry calls fn until it succeeds, for up to a minute: an admission
// webhook may be between leaders, the API server busy, a VolumeAttachment
// not created yet, or an update in conflict (fn reads afresh each time).
func retry(ctx context.Context, what string, fn func() error) error {
	deadline := time.Now().Add(time.Minute)
	backoff := 50 * time.Millisecond
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// snapshotTracker follows the user-requested snapshots (createSnapshot
// true) through the bench's informer: which are ReadyToUse and since when.
type snapshotTracker struct {
	mu       sync.Mutex
	readyAt  map[string]time.Time     // when the informer first saw it ReadyToUse
	notReady map[string]string        // name → status.error
	waiters  map[string]chan struct{} // closed once ReadyToUse
}

func newSnapshotTracker() *snapshotTracker {
	return &snapshotTracker{readyAt: map[string]time.Time{}, notReady: map[string]string{},
		waiters: map[string]chan struct{}{}}
}

func (t *snapshotTracker) observe(s *v1beta1.Snapshot) {
	if !s.Spec.CreateSnapshot {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !s.Status.ReadyToUse {
		delete(t.readyAt, s.Name)
		t.notReady[s.Name] = s.Status.Error
		return
	}
	delete(t.notReady, s.Name)
	if _, ok := t.readyAt[s.Name]; !ok {
		t.readyAt[s.Name] = time.Now()
	}
	if ch := t.waiters[s.Name]; ch != nil {
		close(ch)
		delete(t.waiters, s.Name)
	}
}

func (t *snapshotTracker) forget(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.readyAt, name)
	delete(t.notReady, name)
}

// await returns a channel closed once name is ReadyToUse. Called before the
// create, so that no event is missed.
func (t *snapshotTracker) await(name string) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := make(chan struct{})
	if _, ok := t.readyAt[name]; ok {
		close(ch)
	} else {
		t.waiters[name] = ch
	}
	return ch
}

func (t *snapshotTracker) readyTime(name string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.readyAt[name]
}

func (t *snapshotTracker) readyCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.readyAt)
}

func (t *snapshotTracker) total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.readyAt) + len(t.notReady)
}

// describe names a few snapshots that are not ReadyToUse, for a stall.
func (t *snapshotTracker) describe() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for name, e := range t.notReady {
		out = append(out, fmt.Sprintf("%s (error %q)", name, e))
	}
	slices.Sort(out)
	return fmt.Sprintf("%d snapshots seen but not ReadyToUse, for example: %s", len(out),
		strings.Join(out[:min(5, len(out))], "; "))
}
