package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// The API server itself rejects bad objects through the CRDs' OpenAPI and CEL
// rules, with a message that names the field.
func TestAPIServerRejectsInvalidObjects(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	ctx := context.Background()
	ns := types.DefaultNamespace
	c := env.adminStrata.StrataV1beta1()
	om := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: ns} }
	vol := func(mutate func(*v1beta1.VolumeSpec)) func() error {
		return func() error {
			v := &v1beta1.Volume{ObjectMeta: om("vol-validation"), Spec: v1beta1.VolumeSpec{Size: resource.MustParse("1Gi")}}
			mutate(&v.Spec)
			created, err := c.Volumes(ns).Create(ctx, v, metav1.CreateOptions{})
			if err == nil {
				_ = c.Volumes(ns).Delete(ctx, created.Name, metav1.DeleteOptions{})
			}
			return err
		}
	}

	tests := []struct {
		name string
		call func() error
		// wantMsg are substrings of the rejection; empty means accepted.
		wantMsg []string
	}{
		{"valid volume is accepted", vol(func(s *v1beta1.VolumeSpec) { s.NumberOfReplicas = 3; s.Frontend = "nbd" }), nil},
		{"negative size", vol(func(s *v1beta1.VolumeSpec) { s.Size = resource.MustParse("-1Gi") }),
			[]string{"spec.size", "must be greater than 0"}},
		{"zero size", vol(func(s *v1beta1.VolumeSpec) { s.Size = resource.MustParse("0") }),
			[]string{"spec.size", "must be greater than 0"}},
		{"unknown frontend", vol(func(s *v1beta1.VolumeSpec) { s.Frontend = "iscsi" }),
			[]string{"spec.frontend", `Unsupported value: "iscsi"`}},
		{"zero replicas", vol(func(s *v1beta1.VolumeSpec) { s.NumberOfReplicas = -1 }),
			[]string{"spec.numberOfReplicas", "greater than or equal to 1"}},
		{"too many replicas", vol(func(s *v1beta1.VolumeSpec) { s.NumberOfReplicas = 21 }),
			[]string{"spec.numberOfReplicas", "less than or equal to 20"}},
		{"bad data source", vol(func(s *v1beta1.VolumeSpec) { s.DataSource = "http://x" }),
			[]string{"spec.dataSource", "should match"}},
		{"negative snapshot max size", vol(func(s *v1beta1.VolumeSpec) { s.SnapshotMaxSize = resource.MustParse("-1") }),
			[]string{"spec.snapshotMaxSize", "must not be negative"}},
		{"snapshot without volume", func() error {
			_, err := c.Snapshots(ns).Create(ctx, &v1beta1.Snapshot{ObjectMeta: om("snap-validation")}, metav1.CreateOptions{})
			return err
		}, []string{"spec.volume"}},
		{"attachment ticket of unknown type", func() error {
			va := &v1beta1.VolumeAttachment{ObjectMeta: om("va-validation"), Spec: v1beta1.VolumeAttachmentSpec{
				Volume: "v", AttachmentTickets: map[string]*v1beta1.AttachmentTicket{"t": {ID: "t", Type: "longhorn-api", NodeID: "node-1"}}}}
			_, err := c.VolumeAttachments(ns).Create(ctx, va, metav1.CreateOptions{})
			return err
		}, []string{"spec.attachmentTickets.t.type", `Unsupported value: "longhorn-api"`}},
		{"disk with relative path and negative reserve", func() error {
			n := &v1beta1.Node{ObjectMeta: om("node-validation"), Spec: v1beta1.NodeSpec{Disks: map[string]v1beta1.DiskSpec{
				"d": {Path: "relative", StorageReserved: resource.MustParse("-1Gi")}}}}
			_, err := c.Nodes(ns).Create(ctx, n, metav1.CreateOptions{})
			return err
		}, []string{"spec.disks.d.path", "spec.disks[d].storageReserved", "must not be negative"}},
		{"backing image with a malformed checksum", func() error {
			bi := &v1beta1.BackingImage{ObjectMeta: om("bi-validation"), Spec: v1beta1.BackingImageSpec{
				SourceType: v1beta1.BackingImageSourceTypeDownload, Checksum: "abc"}}
			_, err := c.BackingImages(ns).Create(ctx, bi, metav1.CreateOptions{})
			return err
		}, []string{"spec.checksum", "should match"}},
		{"recurring job with an unknown task", func() error {
			rj := &v1beta1.RecurringJob{ObjectMeta: om("rj-validation"), Spec: v1beta1.RecurringJobSpec{Task: "defrag", Cron: "* * * * *"}}
			_, err := c.RecurringJobs(ns).Create(ctx, rj, metav1.CreateOptions{})
			return err
		}, []string{"spec.task", `Unsupported value: "defrag"`}},
		{"namespace quota below zero", func() error {
			q := resource.MustParse("-5Gi")
			rq := &v1beta1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: v1beta1.DefaultResourceQuotaName, Namespace: "default"},
				Spec: v1beta1.ResourceQuotaSpec{SnapshotLimit: v1beta1.SnapshotLimit{NamespaceTotalSnapshotSizeQuota: &q}}}
			_, err := c.ResourceQuotas("default").Create(ctx, rq, metav1.CreateOptions{})
			return err
		}, []string{"spec.snapshotLimit.namespaceTotalSnapshotSizeQuota", "must not be negative"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if len(tc.wantMsg) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
			for _, m := range tc.wantMsg {
				assert.True(t, strings.Contains(err.Error(), m), "error %q should contain %q", err.Error(), m)
			}
		})
	}
}
