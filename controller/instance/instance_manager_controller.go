package instance

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Event reasons of the instance manager controller.
const (
	EventReasonInstanceManagerRunning     = "Running"
	EventReasonInstanceManagerUnreachable = "Unreachable"

	imConditionReasonWatching    = "WatchStreamOpen"
	imConditionReasonUnreachable = "WatchStreamFailed"
)

// syncInstanceManager creates this node's InstanceManager CR if missing and
// reports its endpoint and state from the Watch stream's last word.
func (c *InstanceManagerController) syncInstanceManager(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return err
	}
	imRO, err := c.DS.InstanceManagers.GetRO(name)
	if apierrors.IsNotFound(err) {
		return c.createInstanceManager(ctx, name)
	}
	if err != nil {
		return err
	}

	im := imRO.DeepCopy()
	conn := c.connection()
	now := metav1.NewTime(c.DS.Clock.Now())
	im.Status.OwnerID = c.ControllerID
	im.Status.Endpoint = c.address
	if conn.connected {
		im.Status.CurrentState = v1beta1.InstanceStateRunning
		kit.SetCondition(&im.Status.Conditions, v1beta1.ConditionTypeReady, true, imConditionReasonWatching,
			"the instance manager answers on its Watch stream", now)
	} else {
		im.Status.CurrentState = v1beta1.InstanceStateUnknown
		msg := "no Watch stream to the instance manager yet"
		if conn.err != "" {
			im.Status.CurrentState = v1beta1.InstanceStateError
			msg = fmt.Sprintf("Watch stream to %s failed: %s", c.address, conn.err)
		}
		kit.SetCondition(&im.Status.Conditions, v1beta1.ConditionTypeReady, false, imConditionReasonUnreachable, msg, now)
	}
	if equality.Semantic.DeepEqual(imRO.Status, im.Status) {
		return nil
	}
	updated, err := c.DS.InstanceManagers.UpdateStatus(ctx, im)
	if err != nil {
		return err
	}
	if imRO.Status.CurrentState != updated.Status.CurrentState {
		switch updated.Status.CurrentState {
		case v1beta1.InstanceStateRunning:
			c.Recorder.Event(updated, corev1.EventTypeNormal, EventReasonInstanceManagerRunning, "instance manager at "+c.address+" answers")
		case v1beta1.InstanceStateError:
			c.Recorder.Event(updated, corev1.EventTypeWarning, EventReasonInstanceManagerUnreachable, conn.err)
		}
	}
	return nil
}

func (c *InstanceManagerController) createInstanceManager(ctx context.Context, name string) error {
	im := &v1beta1.InstanceManager{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.DS.Namespace,
			Labels: map[string]string{types.LabelNode: c.ControllerID, types.LabelComponent: "instance-manager"}},
		Spec: v1beta1.InstanceManagerSpec{NodeID: c.ControllerID},
	}
	_, err := c.DS.InstanceManagers.Create(ctx, im)
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
