package e2e

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook"
)

// The webhook tests' objects are named wh-*: other tests' controllers act on
// volumes too, and these must not collide with theirs.

// waitForWebhooks waits until the webhooks answer and every node has
// registered: the replica rule counts the Node CRs.
func waitForWebhooks(t *testing.T) {
	t.Helper()
	require.NoError(t, env.cluster.WaitForWebhooks(context.Background(), types.DefaultNamespace, time.Minute))
	for _, n := range nodeNames {
		require.Eventually(t, func() bool { return nodeReady(t, n) == metav1.ConditionTrue },
			time.Minute, 100*time.Millisecond, "%s becomes Ready", n)
	}
}

func whVolume(name string, replicas int32) *v1beta1.Volume {
	return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
		Spec: v1beta1.VolumeSpec{Size: resource.MustParse("16Mi"), NumberOfReplicas: replicas}}
}

// cleanupWebhookObjects deletes the named volumes and their attachments when
// the test ends. A volume its controller has not released after a few
// seconds loses its finalizers, so that no test leaves objects behind.
func cleanupWebhookObjects(t *testing.T, names ...string) {
	t.Cleanup(func() {
		ctx := context.Background()
		c := env.adminStrata.StrataV1beta1()
		for _, n := range names {
			releaseWorkloadTickets(t, n) // the webhook refuses to delete a volume they hold
			_ = c.Volumes(types.DefaultNamespace).Delete(ctx, n, metav1.DeleteOptions{})
		}
		remaining := func() []*v1beta1.Volume {
			var out []*v1beta1.Volume
			for _, n := range names {
				if v, err := c.Volumes(types.DefaultNamespace).Get(ctx, n, metav1.GetOptions{}); err == nil {
					out = append(out, v)
				}
			}
			return out
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(remaining()) > 0 && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		for _, v := range remaining() {
			t.Logf("volume %s not deleted within 10s (finalizers %v, state %q); removing its finalizers",
				v.Name, v.Finalizers, v.Status.State)
			_, _ = c.Volumes(types.DefaultNamespace).Patch(ctx, v.Name, k8stypes.MergePatchType,
				[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		}
		// The garbage collector would delete the attachments the volumes own,
		// but it may notice them only at its next discovery.
		for _, n := range names {
			_ = c.VolumeAttachments(types.DefaultNamespace).Delete(ctx, n, metav1.DeleteOptions{})
		}
	})
}

func TestWebhookVolumeRules(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	ctx := context.Background()
	volumes := env.adminStrata.StrataV1beta1().Volumes(types.DefaultNamespace)
	cleanupWebhookObjects(t, "wh-too-many", "wh-defaults")

	t.Run("more replicas than nodes is rejected naming the field", func(t *testing.T) {
		_, err := volumes.Create(ctx, whVolume("wh-too-many", 4), metav1.CreateOptions{})
		require.Error(t, err)
		assert.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
		assert.Contains(t, err.Error(), `admission webhook "validator.strata.io" denied the request: `+
			`spec.numberOfReplicas: 4 is more than the 3 nodes in the cluster`)
	})

	t.Run("a created volume gets the finalizer and the defaults", func(t *testing.T) {
		setting, err := env.adminStrata.StrataV1beta1().Settings(types.DefaultNamespace).Get(ctx,
			string(types.SettingDefaultReplicaCount), metav1.GetOptions{})
		require.NoError(t, err)
		want, err := strconv.Atoi(setting.Value)
		require.NoError(t, err)

		v, err := volumes.Create(ctx, whVolume("wh-defaults", 0), metav1.CreateOptions{})
		require.NoError(t, err)
		assert.Contains(t, v.Finalizers, types.FinalizerName)
		assert.EqualValues(t, want, v.Spec.NumberOfReplicas, "from the default-replica-count setting")
		assert.Equal(t, v1beta1.VolumeFrontendNBD, v.Spec.Frontend)
	})

	t.Run("an admin patching spec.nodeID is rejected", func(t *testing.T) {
		_, err := volumes.Patch(ctx, "wh-defaults", k8stypes.MergePatchType, []byte(`{"spec":{"nodeID":"node-1"}}`),
			metav1.PatchOptions{})
		require.Error(t, err)
		assert.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
		assert.Contains(t, err.Error(),
			"spec.nodeID: written only by the VolumeAttachment controller; add an attachment ticket instead")
	})

	t.Run("shrinking is rejected", func(t *testing.T) {
		_, err := volumes.Patch(ctx, "wh-defaults", k8stypes.MergePatchType, []byte(`{"spec":{"size":"8Mi"}}`),
			metav1.PatchOptions{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "spec.size: cannot shrink from 16Mi to 8Mi; a volume can only grow")
	})
}

func TestWebhookVolumeAttachmentRules(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	ctx := context.Background()
	c := env.adminStrata.StrataV1beta1()
	attachments := c.VolumeAttachments(types.DefaultNamespace)
	cleanupWebhookObjects(t, "wh-va")
	vol, err := c.Volumes(types.DefaultNamespace).Create(ctx, whVolume("wh-va", 1), metav1.CreateOptions{})
	require.NoError(t, err)

	ticket := func(id, node string) *v1beta1.AttachmentTicket {
		return &v1beta1.AttachmentTicket{ID: id, Type: v1beta1.AttacherTypeStrataAPI, NodeID: node, Generation: 42}
	}
	// The volume controller may create the volume's attachment first.
	_, err = attachments.Create(ctx, &v1beta1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "wh-va", Namespace: types.DefaultNamespace},
		Spec:       v1beta1.VolumeAttachmentSpec{Volume: "wh-va"}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	update := func(edit func(*v1beta1.VolumeAttachment)) (*v1beta1.VolumeAttachment, error) {
		var updated *v1beta1.VolumeAttachment
		err := retryOnConflict(func() error {
			cur, err := attachments.Get(ctx, "wh-va", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cur.Spec.AttachmentTickets == nil {
				cur.Spec.AttachmentTickets = map[string]*v1beta1.AttachmentTicket{}
			}
			edit(cur)
			updated, err = attachments.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		return updated, err
	}

	t.Run("the attachment is labelled with and owned by its volume", func(t *testing.T) {
		va, err := attachments.Get(ctx, "wh-va", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "wh-va", va.Labels[types.LabelVolume])
		require.Len(t, va.OwnerReferences, 1)
		assert.Equal(t, vol.UID, va.OwnerReferences[0].UID)
		assert.Equal(t, "Volume", va.OwnerReferences[0].Kind)
	})

	t.Run("a ticket whose key differs from its id is rejected", func(t *testing.T) {
		_, err := update(func(va *v1beta1.VolumeAttachment) { va.Spec.AttachmentTickets["key"] = ticket("other", "node-1") })
		require.Error(t, err)
		assert.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
		assert.Contains(t, err.Error(), `spec.attachmentTickets[key].id: "other" differs from its map key "key"`)
	})

	t.Run("ticket generations start at 1 and grow when a ticket changes", func(t *testing.T) {
		added, err := update(func(va *v1beta1.VolumeAttachment) {
			va.Spec.AttachmentTickets["wh-t1"] = ticket("wh-t1", "node-1")
			va.Spec.AttachmentTickets["wh-t2"] = ticket("wh-t2", "node-1")
		})
		require.NoError(t, err)
		assert.EqualValues(t, 1, added.Spec.AttachmentTickets["wh-t1"].Generation, "the writer's 42 is replaced")
		assert.EqualValues(t, 1, added.Spec.AttachmentTickets["wh-t2"].Generation)

		edited, err := update(func(va *v1beta1.VolumeAttachment) { va.Spec.AttachmentTickets["wh-t1"].NodeID = "node-2" })
		require.NoError(t, err)
		assert.EqualValues(t, 2, edited.Spec.AttachmentTickets["wh-t1"].Generation, "edited")
		assert.EqualValues(t, 1, edited.Spec.AttachmentTickets["wh-t2"].Generation, "untouched")
	})

	t.Run("a ticket for a node that does not exist is rejected", func(t *testing.T) {
		_, err := attachments.Patch(ctx, "wh-va", k8stypes.MergePatchType,
			[]byte(`{"spec":{"attachmentTickets":{"t3":{"id":"t3","type":"strata-api","nodeID":"node-9","parameters":null,"generation":0}}}}`),
			metav1.PatchOptions{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), `spec.attachmentTickets[t3].nodeID: "node-9" is not a Strata node`)
	})
}

// The configurations match Strata's kinds (CREATE and UPDATE; DELETE where
// a deletion is judged; CREATE alone for SnapshotGroups, whose spec is
// immutable) and, for the snapshot quota, the creation of VolumeSnapshots,
// VolumeGroupSnapshots and — only while their CRDs exist — KubeVirt's
// VirtualMachineSnapshots and Harvester's VirtualMachineBackups: never a
// status write, never another kind.
func TestWebhookConfigurationsMatchOnlyStrataKindsAndSnapshotRequests(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	ctx := context.Background()
	admission := env.adminKube.AdmissionregistrationV1()
	createOnly := []string{"strata.io/snapshotgroups", "snapshot.storage.k8s.io/volumesnapshots",
		"groupsnapshot.storage.k8s.io/volumegroupsnapshots", "snapshot.kubevirt.io/virtualmachinesnapshots",
		"harvesterhci.io/virtualmachinebackups"}
	// A quota test running beside this one may install the VM kinds at
	// any moment, and the webhook leader follows within a moment: compare
	// what discovery lists with the configuration until they agree.
	var want, got []string
	require.Eventually(t, func() bool {
		want = []string{"strata.io/backingimages", "strata.io/recurringjobs", "strata.io/resourcequotas", "strata.io/snapshots",
			"strata.io/snapshotgroups", "strata.io/volumeattachments", "strata.io/volumes",
			"snapshot.storage.k8s.io/volumesnapshots", "groupsnapshot.storage.k8s.io/volumegroupsnapshots"}
		for _, gv := range []string{"snapshot.kubevirt.io/v1beta1/virtualmachinesnapshots", "harvesterhci.io/v1beta1/virtualmachinebackups"} {
			i := strings.LastIndex(gv, "/")
			if _, err := env.adminKube.Discovery().ServerResourcesForGroupVersion(gv[:i]); err == nil {
				want = append(want, gv[:strings.Index(gv, "/")]+gv[i:])
			}
		}
		vc, err := admission.ValidatingWebhookConfigurations().Get(ctx, webhook.ValidatorConfigName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		// Deleting a volume or a backing image is validated too: one a
		// workload holds, or a volume uses, is refused.
		got = ruleResources(t, vc.Webhooks[0].Rules, []string{"strata.io/volumes", "strata.io/backingimages"}, createOnly)
		assert.NotEmpty(t, vc.Webhooks[0].ClientConfig.CABundle)
		return assert.ObjectsAreEqual(slices.Sorted(slices.Values(want)), slices.Sorted(slices.Values(got)))
	}, 30*time.Second, 200*time.Millisecond, "the validating rules match discovery")
	assert.ElementsMatch(t, want, got, "the validating rules' resources")
	// Backing images have no mutator.
	mc, err := admission.MutatingWebhookConfigurations().Get(ctx, webhook.MutatorConfigName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"strata.io/snapshots", "strata.io/volumeattachments", "strata.io/volumes"},
		ruleResources(t, mc.Webhooks[0].Rules, nil, nil))
}

// ruleResources lists group/resource for every rule, and checks the
// operations on the way: CREATE and UPDATE, and DELETE for withDelete;
// CREATE alone for createOnly.
func ruleResources(t *testing.T, rules []admissionregistrationv1.RuleWithOperations, withDelete, createOnly []string) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				want := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
				switch {
				case slices.Contains(withDelete, g+"/"+res):
					want = append(want, admissionregistrationv1.Delete)
				case slices.Contains(createOnly, g+"/"+res):
					want = want[:1]
				}
				assert.ElementsMatch(t, want, r.Operations, "%s/%s", g, res)
				out = append(out, g+"/"+res)
			}
		}
	}
	return out
}

// A killed webhook leader is replaced: the new leader points the
// configurations at itself and volumes can be written again within seconds.
func TestWebhookLeaderFailover(t *testing.T) {
	waitForWebhooks(t)
	ctx := context.Background()
	leader := webhookLeader(t)
	mgr := env.managers[leader]
	require.NotNil(t, mgr, "the leader %q is one of the managers", leader)
	require.Eventually(t, func() bool { return webhookURLsPointAt(t, mgr.WebhookAddr) },
		30*time.Second, 100*time.Millisecond, "the configurations point at the leader %s", leader)

	require.NoError(t, mgr.Kill())
	killed := time.Now()
	t.Cleanup(func() {
		if env.managers[leader].Exited() {
			if m, err := env.managers[leader].Restart(env.managerOpts); err == nil {
				env.managers[leader] = m
			}
		}
	})
	cleanupWebhookObjects(t, "wh-failover")

	var newLeader string
	require.Eventually(t, func() bool {
		newLeader = webhookLeader(t)
		if newLeader == leader || env.managers[newLeader] == nil || !webhookURLsPointAt(t, env.managers[newLeader].WebhookAddr) {
			return false
		}
		v, err := env.adminStrata.StrataV1beta1().Volumes(types.DefaultNamespace).Create(ctx, whVolume("wh-failover", 1),
			metav1.CreateOptions{})
		return err == nil && len(v.Finalizers) > 0
	}, 15*time.Second, 100*time.Millisecond, "a live manager takes over the webhooks")
	t.Logf("webhook leader %s killed; %s serves the webhooks %.1fs later", leader, newLeader, time.Since(killed).Seconds())

	restarted, err := env.managers[leader].Restart(env.managerOpts)
	require.NoError(t, err)
	env.managers[leader] = restarted
	assert.Equal(t, newLeader, webhookLeader(t), "a restarted manager does not take the lead back")
}

func webhookLeader(t *testing.T) string {
	t.Helper()
	lease, err := env.adminKube.CoordinationV1().Leases(types.DefaultNamespace).Get(context.Background(),
		webhook.LeaderLeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

func webhookURLsPointAt(t *testing.T, addr string) bool {
	t.Helper()
	ctx := context.Background()
	admission := env.adminKube.AdmissionregistrationV1()
	vc, err := admission.ValidatingWebhookConfigurations().Get(ctx, webhook.ValidatorConfigName, metav1.GetOptions{})
	if err != nil || vc.Webhooks[0].ClientConfig.URL == nil {
		return false
	}
	mc, err := admission.MutatingWebhookConfigurations().Get(ctx, webhook.MutatorConfigName, metav1.GetOptions{})
	if err != nil || mc.Webhooks[0].ClientConfig.URL == nil {
		return false
	}
	return *vc.Webhooks[0].ClientConfig.URL == "https://"+addr+"/v1/validate" &&
		*mc.Webhooks[0].ClientConfig.URL == "https://"+addr+"/v1/mutate"
}

// The manager reads no CA Secret (the CA signer's alone), only the trust
// bundle the signer publishes, and writes only its own webhook
// configurations.
func TestWebhookRBAC(t *testing.T) {
	t.Parallel() // reads, or objects of its own: runs beside the others at the end
	waitForWebhooks(t)
	kube := kubernetes.NewForConfigOrDie(env.managerConfig)
	ctx := context.Background()
	secrets := kube.CoreV1().Secrets(types.DefaultNamespace)
	byName := func(name string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	}
	configMaps := kube.CoreV1().ConfigMaps(types.DefaultNamespace)
	tests := []struct {
		name      string
		call      func() error
		forbidden bool
	}{
		{"get the CA Secret", func() error { _, err := secrets.Get(ctx, pki.CASecretName, metav1.GetOptions{}); return err }, true},
		{"list the CA Secret by name", func() error { _, err := secrets.List(ctx, byName(pki.CASecretName)); return err }, true},
		{"update the CA Secret", func() error {
			_, err := secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: pki.CASecretName}}, metav1.UpdateOptions{})
			return err
		}, true},
		// The trust bundle: read (an informer by name), never written.
		{"list the CA bundle by name", func() error {
			_, err := configMaps.List(ctx, byName(types.CABundleConfigMap))
			return err
		}, false},
		{"patch the CA bundle", func() error {
			_, err := configMaps.Patch(ctx, types.CABundleConfigMap, k8stypes.MergePatchType, []byte(`{}`),
				metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, true},
		{"list every Secret in strata-system", func() error { _, err := secrets.List(ctx, metav1.ListOptions{}); return err }, true},
		// A backup target's credential Secret is read by name (get only),
		// and only the one the Role names: a missing one is NotFound, any
		// other Forbidden.
		{"get the backup credential Secret by name", func() error {
			_, err := secrets.Get(ctx, types.BackupCredentialsSecret, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}, false},
		{"get another Secret by name", func() error {
			_, err := secrets.Get(ctx, "someone-elses", metav1.GetOptions{})
			return err
		}, true},
		{"update another Secret", func() error {
			_, err := secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses"}}, metav1.UpdateOptions{})
			return err
		}, true},
		// The leader only applies them (a patch; dry run here).
		{"patch the validating configuration", func() error {
			_, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(ctx, webhook.ValidatorConfigName,
				k8stypes.MergePatchType, []byte(`{}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, false},
		{"get the validating configuration", func() error {
			_, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ValidatorConfigName, metav1.GetOptions{})
			return err
		}, true},
		{"patch another webhook configuration", func() error {
			_, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, "someone-elses",
				k8stypes.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
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
