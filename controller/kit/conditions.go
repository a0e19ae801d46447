package kit

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// OrUnknown is a state for a message, "in an unknown state" when empty.
func OrUnknown(s string) string {
	if s == "" {
		return "in an unknown state"
	}
	return s
}

// SetCondition sets a condition by type, its transition time moving only
// when its status changes (meta.SetStatusCondition).
func SetCondition(conds *[]metav1.Condition, condType string, status bool, reason, message string, now metav1.Time) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: condType, Status: s, Reason: reason, Message: message, LastTransitionTime: now,
	})
}
