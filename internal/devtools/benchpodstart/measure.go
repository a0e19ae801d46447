package benchpodstart

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/package/images"
)

type claimKind string

const (
	kindNew     claimKind = "new claim"
	kindRestore claimKind = "restored claim"
	kindClone   claimKind = "cloned claim"
)

// kindPrefix names a kind's claims and Pods.
var kindPrefix = map[claimKind]string{kindNew: "new", kindRestore: "restore", kindClone: "clone"}

// The steps of a Pod's start, in order, as seen through watches.
type step int

const (
	stepBound     step = iota // the claim has its PersistentVolume (provisioned)
	stepScheduled             // the Pod has a node
	stepVACreated             // the attach-detach controller asked for the attachment
	stepAttached              // csi-attacher's ControllerPublish returned
	stepRunning               // the Pod runs
	numSteps
)

var stepNames = [numSteps]string{"bound", "scheduled", "VA created", "attached", "running"}

// sample is one Pod's start: when each step was seen, from the apply.
type sample struct {
	kind    claimKind
	start   time.Time
	seen    [numSteps]time.Time
	csi     map[string]time.Duration // CSI method → its duration (summed over calls)
	failed  int                      // CSI calls that failed (each a retry by a sidecar or the kubelet)
	pv, pvc string
}

// at is how long after the apply the step was seen.
func (s *sample) at(st step) time.Duration {
	if s.seen[st].IsZero() {
		return -1
	}
	return s.seen[st].Sub(s.start)
}

type bench struct {
	log     logrus.FieldLogger
	kube    kubernetes.Interface
	dyn     dynamic.Interface
	logsDir string
	size    resource.Quantity
	fillMiB int
}

const (
	sourceClaim   = "source"
	sourceSnap    = "source-snap"
	sampleTimeout = 3 * time.Minute
)

var volumeSnapshots = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

func (b *bench) setup(ctx context.Context) error {
	_, err := b.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// watcher records when each step of each claim was first seen.
type watcher struct {
	mu     sync.Mutex
	claims map[string]*sample // by claim (and Pod) name
	byPV   map[string]*sample
}

func (w *watcher) mark(s *sample, st step) {
	if s != nil && s.seen[st].IsZero() {
		s.seen[st] = time.Now()
	}
}

func (w *watcher) onClaim(c *corev1.PersistentVolumeClaim) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.claims[c.Name]; s != nil && c.Spec.VolumeName != "" {
		s.pv = c.Spec.VolumeName
		w.byPV[s.pv] = s
		w.mark(s, stepBound)
	}
}

func (w *watcher) onPod(p *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.claims[p.Name]
	if p.Spec.NodeName != "" {
		w.mark(s, stepScheduled)
	}
	if p.Status.Phase == corev1.PodRunning {
		w.mark(s, stepRunning)
	}
}

func (w *watcher) onAttachment(va *storagev1.VolumeAttachment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.byPV[ptr.Deref(va.Spec.Source.PersistentVolumeName, "")]
	w.mark(s, stepVACreated)
	if va.Status.Attached {
		w.mark(s, stepAttached)
	}
}

// watch starts the informers the steps are seen through (resync 0).
func (b *bench) watch(ctx context.Context) (*watcher, error) {
	w := &watcher{claims: map[string]*sample{}, byPV: map[string]*sample{}}
	nsf := informers.NewSharedInformerFactoryWithOptions(b.kube, 0, informers.WithNamespace(benchNamespace))
	all := informers.NewSharedInformerFactory(b.kube, 0)
	handlers := []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{
		{nsf.Core().V1().PersistentVolumeClaims().Informer(), func(o any) {
			if c, ok := o.(*corev1.PersistentVolumeClaim); ok {
				w.onClaim(c)
			}
		}},
		{nsf.Core().V1().Pods().Informer(), func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				w.onPod(p)
			}
		}},
		{all.Storage().V1().VolumeAttachments().Informer(), func(o any) {
			if va, ok := o.(*storagev1.VolumeAttachment); ok {
				w.onAttachment(va)
			}
		}},
	}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: h.fn, UpdateFunc: func(_, n any) { h.fn(n) },
		}); err != nil {
			return nil, err
		}
	}
	nsf.Start(ctx.Done())
	all.Start(ctx.Done())
	nsf.WaitForCacheSync(ctx.Done())
	all.WaitForCacheSync(ctx.Done())
	return w, nil
}

// measure applies a claim of the kind and a Pod on it, as one kubectl
// apply would, and waits for the Pod to run.
func (b *bench) measure(ctx context.Context, w *watcher, kind claimKind, name string) (*sample, error) {
	s := &sample{kind: kind, pvc: name}
	w.mu.Lock()
	w.claims[name] = s
	s.start = time.Now()
	w.mu.Unlock()
	if err := b.apply(ctx, kind, name); err != nil {
		return nil, err
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, sampleTimeout, true, func(context.Context) (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return !s.seen[stepRunning].IsZero(), nil
	})
	if err != nil {
		return nil, fmt.Errorf("pod %s not running after %s: %w", name, sampleTimeout, err)
	}
	if err := b.readCSILogs(ctx, s); err != nil {
		return nil, err
	}
	if name != sourceClaim {
		return s, b.remove(ctx, name)
	}
	return s, nil
}

func (b *bench) apply(ctx context.Context, kind claimKind, name string) error {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: b.size}},
		},
	}
	switch kind {
	case kindRestore:
		pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: sourceSnap}
	case kindClone:
		pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: sourceClaim}
	}
	if _, err := b.kube.CoreV1().PersistentVolumeClaims(benchNamespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "app", Image: images.WorkloadRef,
				Command:      []string{"sh", "-c", "date >> /data/starts; sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
		},
	}
	if name == sourceClaim && b.fillMiB > 0 {
		// Written before the Pod runs, so the snapshot taken once it runs
		// holds all of it.
		pod.Spec.InitContainers = []corev1.Container{{Name: "fill", Image: images.WorkloadRef,
			Command:      []string{"sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=/data/fill bs=1M count=%d && sync", b.fillMiB)},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}}
	}
	_, err := b.kube.CoreV1().Pods(benchNamespace).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// snapshotSource takes the VolumeSnapshot the restores start from (not timed).
func (b *bench) snapshotSource(ctx context.Context) error {
	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": sourceSnap, "namespace": benchNamespace},
		"spec":     map[string]any{"source": map[string]any{"persistentVolumeClaimName": sourceClaim}},
	}}
	res := b.dyn.Resource(volumeSnapshots).Namespace(benchNamespace)
	if _, err := res.Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := res.Get(ctx, sourceSnap, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse")
		return ready, nil
	})
}

// remove deletes a sample's Pod and claim and waits for its volume to go,
// so the next sample starts on a quiet cluster.
func (b *bench) remove(ctx context.Context, name string) error {
	pvc, err := b.kube.CoreV1().PersistentVolumeClaims(benchNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if err := b.kube.CoreV1().Pods(benchNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		return err
	}
	if err := b.kube.CoreV1().PersistentVolumeClaims(benchNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := b.kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
