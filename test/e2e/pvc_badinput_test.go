package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
)

// What a user gets wrong shows where the user looks: the object stays
// unfulfilled and its events (kubectl describe, kubectl get events) carry
// the reason, in the driver's words when the driver refused, naming what
// was wrong. Nothing is left behind once the object is deleted.
func TestBadInputIsReportedInEvents(t *testing.T) {
	kubectlApply(t, `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: strata-bad-param}
provisioner: driver.strata.io
parameters: {numberOfReplicas: "2", staleReplicaTimeout: "30"}
reclaimPolicy: Delete
volumeBindingMode: Immediate`)
	t.Cleanup(func() { _, _ = tryKubectl(t, "delete", "storageclass", "strata-bad-param", "--ignore-not-found") })

	claim := func(name, size string, edit func(*corev1.PersistentVolumeClaim)) func(t *testing.T) string {
		return func(t *testing.T) string { return createClaimWith(t, name, size, edit).Name }
	}
	cases := []struct {
		name   string
		kind   string                    // the object whose events tell
		create func(t *testing.T) string // makes the object, returns its name
		reason string
		want   []string // in one event's message
	}{
		{
			name: "unknown StorageClass parameter", kind: "PersistentVolumeClaim",
			create: claim("bad-param", "32Mi", func(c *corev1.PersistentVolumeClaim) {
				c.Spec.StorageClassName = ptr.To("strata-bad-param")
			}),
			reason: "ProvisioningFailed",
			want:   []string{"InvalidArgument", `parameter "staleReplicaTimeout": unknown`},
		},
		{
			name: "size beyond every disk", kind: "PersistentVolumeClaim",
			create: claim("bad-size", "10Ti", nil),
			reason: "ProvisioningFailed",
			want:   []string{"ResourceExhausted", "replicas cannot be placed"},
		},
		{
			name: "ReadWriteMany", kind: "PersistentVolumeClaim",
			create: claim("bad-rwx", "32Mi", func(c *corev1.PersistentVolumeClaim) {
				c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
			}),
			reason: "ProvisioningFailed",
			want:   []string{"InvalidArgument", "access mode MULTI_NODE_MULTI_WRITER (ReadWriteMany) is not supported"},
		},
		{
			// The snapshot-controller refuses it before the driver is asked
			// (see TestCSICreateSnapshotOfMissingVolume for the driver).
			name: "VolumeSnapshot of a missing claim", kind: "VolumeSnapshot",
			create: func(t *testing.T) string {
				kubectlApply(t, `apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap-of-missing, namespace: default}
spec: {volumeSnapshotClassName: strata, source: {persistentVolumeClaimName: no-such-claim}}`)
				t.Cleanup(func() {
					_, _ = tryKubectl(t, "-n", podNamespace, "delete", "volumesnapshot", "snap-of-missing", "--ignore-not-found", "--timeout=60s")
				})
				return "snap-of-missing"
			},
			reason: "SnapshotContentCreationFailed",
			want:   []string{"cannot get claim from snapshot"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			name := tc.create(t)
			msg := waitEvent(t, tc.kind, name, tc.reason, tc.want, 90*time.Second)
			t.Logf("%s %s: event after %s: %s: %s", tc.kind, name, time.Since(start).Round(time.Millisecond), tc.reason, msg)
			describe := kubectl(t, "-n", podNamespace, "describe", strings.ToLower(tc.kind), name)
			for _, w := range tc.want {
				assert.Contains(t, describe, w, "kubectl describe shows the reason")
			}
			switch tc.kind {
			case "PersistentVolumeClaim":
				pvc, err := env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Get(context.Background(), name, metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, corev1.ClaimPending, pvc.Status.Phase, "the claim stays Pending")
				require.NoError(t, env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(context.Background(), name, metav1.DeleteOptions{}))
				// A refused request leaves no volume (the unschedulable one
				// is deleted again), also once the provisioner gives up.
				require.Eventually(t, func() bool { return len(volumesOfClaim(t, name)) == 0 }, time.Minute, 250*time.Millisecond,
					"no volume of claim %s is left", name)
			case "VolumeSnapshot":
				status := kubectl(t, "-n", podNamespace, "get", "volumesnapshot", name, "-o", "jsonpath={.status}")
				for _, w := range tc.want {
					assert.Contains(t, status, w, "status.error says so")
				}
				assert.NotContains(t, status, `"readyToUse":true`)
				assert.Empty(t, kubectl(t, "-n", podNamespace, "get", "volumesnapshot", name, "-o",
					"jsonpath={.status.boundVolumeSnapshotContentName}"), "no content was made")
			}
		})
	}
}

// The driver itself, asked for a snapshot of a volume that does not exist
// (which the snapshot-controller never lets through: it needs the claim and
// its PV first), answers NotFound naming the volume.
func TestCSICreateSnapshotOfMissingVolume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	controller := csispec.NewControllerClient(startCSIController(t))
	_, err := controller.CreateSnapshot(ctx, &csispec.CreateSnapshotRequest{Name: "snapshot-e2e-of-missing",
		SourceVolumeId: "pvc-e2e-no-such-volume"})
	require.Error(t, err)
	assert.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "pvc-e2e-no-such-volume", "the message names the volume")
	_, err = env.adminStrata.StrataV1beta1().Snapshots(ns).Get(ctx, "snapshot-e2e-of-missing", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "no Snapshot CR is made for a missing volume: %v", err)
}

// waitEvent waits for an event of the object with the reason and a message
// holding every wanted string, and returns that message. On time-out it
// says which events the object did get.
func waitEvent(t *testing.T, kind, name, reason string, want []string, timeout time.Duration) string {
	t.Helper()
	return waitEventIn(t, podNamespace, kind, name, reason, want, timeout)
}

// waitEventIn is waitEvent for an object in namespace.
func waitEventIn(t *testing.T, namespace, kind, name, reason string, want []string, timeout time.Duration) string {
	t.Helper()
	selector := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name}.AsSelector().String()
	deadline := time.Now().Add(timeout)
	var seen []string
	for time.Now().Before(deadline) {
		list, err := env.adminKube.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: selector})
		if err == nil {
			seen = seen[:0]
			for _, e := range list.Items {
				seen = append(seen, fmt.Sprintf("%s (%s, x%d): %s", e.Reason, e.Source.Component, e.Count, e.Message))
				if e.Reason == reason && containsAll(e.Message, want) {
					return e.Message
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s %s: no %s event containing %q within %s; events:\n  %s", kind, name, reason, want, timeout,
		strings.Join(seen, "\n  "))
	return ""
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
