package kit

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func OrUnknown(s string) string {
	if s == "" {
		return "in an unknown state"
	}
	return s
}

func SetCondition(conds *[]metav1.Condition, condType string, status bool, reason, message string, now metav1.Time) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: condType, Status: s, Reason: reason, Message: message, LastTransitionTime: now,
	})
}

func FindCondition(conds []metav1.Condition, t string) *metav1.Condition {
	return meta.FindStatusCondition(conds, t)
}
