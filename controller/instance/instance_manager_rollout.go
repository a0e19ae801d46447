package instance

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Reasons of the InstanceManager's UpToDate condition, and the events.
const (
	EventReasonInstanceManagerReplaced = "Replaced"
	EventReasonInstanceManagerOutdated = "Outdated"

	imRolloutReasonCurrent       = "NewestRevision"
	imRolloutReasonVolumesInUse  = "VolumesInUse"
	imRolloutReasonOthersUnready = "OtherInstanceManagersNotReady"
	imRolloutReasonReplacing     = "Replacing"
)

// maxNamed bounds the volumes a condition's message names.
const maxNamed = 5

// syncRollout judges this node's instance-manager Pod against its
// DaemonSet's newest revision and, when it is outdated and nothing here is
// in use, deletes it (the DaemonSet makes the new one).
func (c *InstanceManagerRolloutController) syncRollout(ctx context.Context, _ string) error {
	pod, newest, err := c.podAndNewestRevision()
	if err != nil || pod == nil || newest == nil {
		return err
	}
	running, wanted := pod.Labels[appsv1.DefaultDaemonSetUniqueLabelKey], newest.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]
	if running == wanted {
		return c.setUpToDate(ctx, true, imRolloutReasonCurrent,
			fmt.Sprintf("Pod %s runs the DaemonSet's newest revision %s", pod.Name, wanted))
	}
	outdated := fmt.Sprintf("Pod %s runs revision %s, the DaemonSet's newest is %s", pod.Name, running, wanted)
	if inUse := c.volumesInUse(); len(inUse) > 0 {
		return c.setUpToDate(ctx, false, imRolloutReasonVolumesInUse, fmt.Sprintf(
			"%s; it is replaced once no attached volume has an engine or a replica on this node (%d now: %s)",
			outdated, len(inUse), strings.Join(inUse[:min(len(inUse), maxNamed)], ", ")))
	}
	if others := c.othersNotReady(); len(others) > 0 {
		return c.setUpToDate(ctx, false, imRolloutReasonOthersUnready, fmt.Sprintf(
			"%s; it is replaced once the instance managers of the other nodes are ready (not now: %s)",
			outdated, strings.Join(others, ", ")))
	}
	if err := c.setUpToDate(ctx, false, imRolloutReasonReplacing, outdated+"; nothing on this node is in use: replacing it"); err != nil {
		return err
	}
	err = c.DS.KubeClient.CoreV1().Pods(c.DS.Namespace).Delete(ctx, pod.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone or replaced already: the informer brings the next state
	}
	if err != nil {
		return fmt.Errorf("deleting the outdated instance-manager Pod %s: %w", pod.Name, err)
	}
	c.Logger.WithField("pod", pod.Name).WithField("from", running).WithField("to", wanted).
		Info("Replaced the outdated instance-manager Pod: nothing on this node was in use")
	if im, err := c.DS.InstanceManagers.GetRO(kit.InstanceManagerName(c.ControllerID)); err == nil {
		c.Recorder.Eventf(im, corev1.EventTypeNormal, EventReasonInstanceManagerReplaced,
			"deleted Pod %s (revision %s) for the DaemonSet's revision %s: nothing on the node was in use", pod.Name, running, wanted)
	}
	return nil
}

// podAndNewestRevision is this node's instance-manager Pod and the newest
// revision of the DaemonSet that made it; nil when either is not known.
func (c *InstanceManagerRolloutController) podAndNewestRevision() (*corev1.Pod, *appsv1.ControllerRevision, error) {
	pod, err := c.ownPod()
	if err != nil || pod == nil {
		return nil, nil, err
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "DaemonSet" {
		return nil, nil, nil
	}
	newest, err := c.pods.NewestRevision(string(owner.UID))
	return pod, newest, err
}

// outdated tells, from the caches, whether this node's instance-manager
// Pod runs an older revision than its DaemonSet's newest.
func (c *InstanceManagerRolloutController) outdated() bool {
	pod, newest, err := c.podAndNewestRevision()
	return err == nil && pod != nil && newest != nil &&
		pod.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] != newest.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]
}

// volumesInUse names the volumes with an engine or a replica on this node
// that are not detached: replacing the instance manager would cut their
// I/O (an engine here) or degrade them (a replica here).
func (c *InstanceManagerRolloutController) volumesInUse() []string {
	var names []string
	add := func(volume string) {
		v, err := c.DS.Volumes.GetRO(volume)
		if err == nil && v.Status.State != v1beta1.VolumeStateDetached && !slices.Contains(names, volume) {
			names = append(names, volume)
		}
	}
	engines, _ := c.DS.Engines.ListByIndexRO(datastore.IndexByNode, c.ControllerID)
	for _, e := range engines {
		add(e.Spec.VolumeName)
	}
	replicas, _ := c.DS.Replicas.ListByIndexRO(datastore.IndexByNode, c.ControllerID)
	for _, r := range replicas {
		add(r.Spec.VolumeName)
	}
	slices.Sort(names)
	return names
}

// othersNotReady names the other nodes' instance-manager Pods that are not
// ready (or are going away).
func (c *InstanceManagerRolloutController) othersNotReady() []string {
	pods, err := c.pods.Pods.List(labels.Everything())
	if err != nil {
		return []string{err.Error()}
	}
	var names []string
	for _, p := range pods {
		if p.Spec.NodeName != c.ControllerID && (p.DeletionTimestamp != nil || !podIsReady(p)) {
			names = append(names, p.Name+" on "+p.Spec.NodeName)
		}
	}
	slices.Sort(names)
	return names
}

func podIsReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// setUpToDate writes the UpToDate condition on this node's
// InstanceManager when it changed; a new reason for waiting is an event.
func (c *InstanceManagerRolloutController) setUpToDate(ctx context.Context, upToDate bool, reason, message string) error {
	imRO, err := c.DS.InstanceManagers.GetRO(kit.InstanceManagerName(c.ControllerID))
	if apierrors.IsNotFound(err) {
		return nil // the instance manager controller creates it; its add requeues us
	}
	if err != nil {
		return err
	}
	before := meta.FindStatusCondition(imRO.Status.Conditions, v1beta1.ConditionTypeUpToDate)
	im := imRO.DeepCopy()
	kit.SetCondition(&im.Status.Conditions, v1beta1.ConditionTypeUpToDate, upToDate, reason, message, metav1.NewTime(c.DS.Clock.Now()))
	if equality.Semantic.DeepEqual(imRO.Status, im.Status) {
		return nil
	}
	updated, err := c.DS.InstanceManagers.UpdateStatus(ctx, im)
	if err != nil {
		return err
	}
	if !upToDate && reason != imRolloutReasonReplacing && (before == nil || before.Reason != reason) {
		c.Recorder.Event(updated, corev1.EventTypeNormal, EventReasonInstanceManagerOutdated, message)
	}
	return nil
}
