package backup

import (
	"context"
	"errors"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
)

// A target naming a Secret the managers' Role does not list is Forbidden
// by the API server; the condition and the event say so, name the Secret
// and say what to add to the Role, rather than calling it missing.
func TestBackupTargetCredentialSecretForbidden(t *testing.T) {
	env := dstest.New(t, []runtime.Object{fixture.SchedNode("node-1"), testBackupTarget("s3://b@us-east-1/x", "team-creds")},
		[]runtime.Object{fixture.Lease("node-1", 0)})
	env.Kube.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := a.(k8stesting.GetAction).GetName()
		return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), name, errors.New(
			`User "system:serviceaccount:strata-system:strata-manager" cannot get resource "secrets" in API group "" in the namespace "strata-system"`))
	})
	rec := record.NewFakeRecorder(10)
	c, err := NewBackupTargetController(logrus.New(), env.DS, rec, "node-1")
	require.NoError(t, err)
	require.NoError(t, c.syncBackupTarget(context.Background(), fixture.NS+"/default"))

	bt, err := env.Strata.StrataV1beta1().BackupTargets(fixture.NS).Get(context.Background(), "default", metav1.GetOptions{})
	require.NoError(t, err)
	assert.False(t, bt.Status.Available)
	cond := meta.FindStatusCondition(bt.Status.Conditions, ConditionTypeAvailable)
	require.NotNil(t, cond)
	assert.Equal(t, BackupTargetReasonForbidden, cond.Reason)
	for _, want := range []string{"Secret strata-system/team-creds is forbidden to the managers",
		`add "team-creds" to the resourceNames`, "Role strata-manager", "or use Secret strata-backup-credentials"} {
		assert.Contains(t, cond.Message, want)
	}
	events := <-rec.Events
	assert.Contains(t, events, "Warning BackupTargetUnavailable")
	assert.Contains(t, events, `add "team-creds" to the resourceNames`)
}
