package instance

import (
	"context"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

const imPodSelector = "app=strata-instance-manager"

func imDaemonSetRef() []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "strata-instance-manager",
		UID: "ds-uid", Controller: new(true)}}
}

func imPod(name, node, revision string, ready bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fixture.NS, UID: k8stypes.UID("uid-" + name),
			Labels:          map[string]string{"app": "strata-instance-manager", appsv1.DefaultDaemonSetUniqueLabelKey: revision},
			OwnerReferences: imDaemonSetRef()},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func imRevision(hash string, revision int64) *appsv1.ControllerRevision {
	return &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{Name: "strata-instance-manager-" + hash, Namespace: fixture.NS,
			Labels:          map[string]string{"app": "strata-instance-manager", appsv1.DefaultDaemonSetUniqueLabelKey: hash},
			OwnerReferences: imDaemonSetRef()},
		Revision: revision,
	}
}

func TestInstanceManagerRolloutSync(t *testing.T) {
	revisions := []runtime.Object{imRevision("old", 1), imRevision("new", 2)}
	attached := func(v *v1beta1.Volume) { v.Status.State = v1beta1.VolumeStateAttached }
	replicaHere := fixture.Replica("v1-r-1", "node-1")
	tests := []struct {
		name        string
		strata      []runtime.Object
		pods        []runtime.Object
		wantWrites  []string
		wantDeleted bool
		wantReason  string // of UpToDate; "" when not written
		wantEvents  []string
		syncedOnce  bool // the same sync ran before, and its verdict is cached
	}{
		{name: "the newest revision: up to date", strata: []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{})},
			pods:       []runtime.Object{imPod("im-a", "node-1", "new", true)},
			wantWrites: []string{"update instancemanagers/status im-node-1"}, wantReason: imRolloutReasonCurrent},
		{name: "outdated with a replica of an attached volume here: waits",
			strata:     []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{}), fixture.Volume(attached), replicaHere},
			pods:       []runtime.Object{imPod("im-a", "node-1", "old", true)},
			wantWrites: []string{"update instancemanagers/status im-node-1"}, wantReason: imRolloutReasonVolumesInUse,
			wantEvents: []string{"Normal Outdated"}},
		{name: "outdated, the node idle, another instance manager not ready: waits",
			strata:     []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{}), fixture.Volume(), replicaHere},
			pods:       []runtime.Object{imPod("im-a", "node-1", "old", true), imPod("im-b", "node-2", "new", false)},
			wantWrites: []string{"update instancemanagers/status im-node-1"}, wantReason: imRolloutReasonOthersUnready,
			wantEvents: []string{"Normal Outdated"}},
		{name: "outdated and the node idle: the Pod is deleted",
			strata:     []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{}), fixture.Volume(), replicaHere},
			pods:       []runtime.Object{imPod("im-a", "node-1", "old", true), imPod("im-b", "node-2", "old", true)},
			wantWrites: []string{"update instancemanagers/status im-node-1"}, wantReason: imRolloutReasonReplacing,
			wantDeleted: true, wantEvents: []string{"Normal Replaced"}},
		{name: "another node's Pod is not this node's", strata: []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{})},
			pods: []runtime.Object{imPod("im-b", "node-2", "old", true)}},
		{name: "still waiting for the same volumes: no write, no event", syncedOnce: true,
			strata: []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{}), fixture.Volume(attached), replicaHere},
			pods:   []runtime.Object{imPod("im-a", "node-1", "old", true)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.NewWithInstanceManagerPods(t, tc.strata, append(tc.pods, revisions...), imPodSelector)
			rec := record.NewFakeRecorder(20)
			c, err := NewInstanceManagerRolloutController(logrus.New(), env.DS, rec, "node-1")
			require.NoError(t, err)
			if tc.syncedOnce {
				require.NoError(t, c.syncRollout(context.Background(), c.key()))
				require.Eventually(t, func() bool { // the cache holds the first verdict
					im, err := env.DS.InstanceManagers.GetRO("im-node-1")
					return err == nil && meta.FindStatusCondition(im.Status.Conditions, v1beta1.ConditionTypeUpToDate) != nil
				}, 5*time.Second, 10*time.Millisecond)
				fixture.DrainEvents(rec)
			}
			env.ClearActions()

			require.NoError(t, c.syncRollout(context.Background(), c.key()))
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()), "Strata writes")
			var kubeWrites []string
			if tc.wantDeleted {
				kubeWrites = []string{"delete pods im-a"}
			}
			assert.Equal(t, kubeWrites, fixture.Writes(env.Kube.Actions()), "Pod deletes")
			fixture.AssertEvents(t, tc.wantEvents, rec)
			if tc.wantReason != "" {
				im, err := env.Strata.StrataV1beta1().InstanceManagers(fixture.NS).Get(context.Background(), "im-node-1", metav1.GetOptions{})
				require.NoError(t, err)
				cond := meta.FindStatusCondition(im.Status.Conditions, v1beta1.ConditionTypeUpToDate)
				require.NotNil(t, cond)
				assert.Equal(t, tc.wantReason, cond.Reason, cond.Message)
			}
		})
	}
}
