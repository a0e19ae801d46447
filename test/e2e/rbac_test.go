package e2e

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/types"
)

// The managers run with exactly the shipped ClusterRole and Role: what they
// need is allowed, and anything else is forbidden.
func TestManagerRunsUnderShippedRBAC(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	kube := kubernetes.NewForConfigOrDie(env.managerConfig)
	strata := versioned.NewForConfigOrDie(env.managerConfig)
	ctx := context.Background()
	ns := types.DefaultNamespace

	tests := []struct {
		name      string
		call      func() error
		forbidden bool
	}{
		{"list volumes", func() error {
			_, err := strata.StrataV1beta1().Volumes(ns).List(ctx, metav1.ListOptions{})
			return err
		}, false},
		{"list resource quotas in every namespace", func() error {
			_, err := strata.StrataV1beta1().ResourceQuotas("").List(ctx, metav1.ListOptions{})
			return err
		}, false},
		{"watch PVCs", func() error {
			w, err := kube.CoreV1().PersistentVolumeClaims("").Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}, false},
		{"list leases in strata-system", func() error {
			_, err := kube.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
			return err
		}, false},
		// Uploads: the uploader's token and access are reviewed (api/auth.go).
		{"create a TokenReview", func() error {
			_, err := kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
				Spec: authenticationv1.TokenReviewSpec{Token: "not-a-token"}}, metav1.CreateOptions{})
			return err
		}, false},
		{"create a SubjectAccessReview", func() error {
			_, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: "someone", ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: ns, Verb: "update", Group: "strata.io", Resource: "backingimages"}}}, metav1.CreateOptions{})
			return err
		}, false},
		{"read secrets in kube-system", func() error {
			_, err := kube.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}, true},
		{"create a deployment", func() error {
			_, err := kube.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		}, true},
		{"delete a namespace", func() error {
			return kube.CoreV1().Namespaces().Delete(ctx, "default", metav1.DeleteOptions{})
		}, true},
		{"update a Kubernetes node", func() error {
			_, err := kube.CoreV1().Nodes().Update(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.UpdateOptions{})
			return err
		}, true},
		{"create a lease outside strata-system", func() error {
			_, err := kube.CoordinationV1().Leases("default").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if tc.forbidden {
				assert.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
				return
			}
			assert.NoError(t, err)
		})
	}
}
